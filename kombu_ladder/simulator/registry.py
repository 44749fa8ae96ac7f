"""Which SimulatedBroker a ``ladder-sim://localhost/<name>`` URL means, and the URL scheme itself."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from kombu.transport import TRANSPORT_ALIASES

__all__ = ["register", "lookup", "unique_name", "install_scheme"]

_brokers: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
_lock = threading.Lock()
_ids = itertools.count(1)


def install_scheme(scheme: str = "ladder-sim") -> None:
    """Make ``scheme://`` URLs resolve to the simulator's kombu transport."""
    TRANSPORT_ALIASES.setdefault(scheme, "kombu_ladder.simulator.transport:Transport")


def unique_name() -> str:
    """Return a broker name no other broker in this process has."""
    return f"sim-{next(_ids)}"


def register(name: str, broker: Any) -> None:
    """Make ``broker`` reachable as ``ladder-sim://localhost/<name>``.

    Raises:
        ValueError: another live broker already has that name.
    """
    with _lock:
        existing = _brokers.get(name)
        if existing is not None and existing is not broker:
            raise ValueError(f"a SimulatedBroker named {name!r} already exists in this process")
        _brokers[name] = broker


def lookup(name: str) -> Any:
    """Return the broker registered as ``name``.

    Raises:
        ValueError: no live broker has that name (it was garbage-collected, or
            the URL names no broker created in this process).
    """
    with _lock:
        broker = _brokers.get(name or "")
    if broker is None:
        raise ValueError(
            f"no SimulatedBroker named {name!r} in this process: a ladder-sim:// URL only reaches a broker "
            "created (and still referenced) in the same process; use broker.connection() or broker.url"
        )
    return broker
