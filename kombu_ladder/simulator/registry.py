"""Which SimulatedBroker a ``ladder-sim://<name>`` URL means, and the URL scheme itself."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable

from ..brokers import SIMULATOR

__all__ = ["SCHEME", "register", "lookup", "named", "name_in", "unique_name"]

#: The URL scheme of the simulator's transport.
SCHEME = SIMULATOR

_brokers: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
#: Brokers made by :func:`named` (a URL alone): kept for the life of the process, as a server would be.
_kept: dict[str, Any] = {}
_lock = threading.RLock()
_ids = itertools.count(1)


def unique_name() -> str:
    """Return a broker name no other broker in this process has."""
    return f"sim-{next(_ids)}"


def name_in(hostname: Any, virtual_host: Any) -> str:
    """The broker name a URL gives: ``ladder-sim://localhost/<name>`` or ``ladder-sim://<name>``."""
    if virtual_host and virtual_host != "/":
        return str(virtual_host)
    return str(hostname or "localhost")


def register(name: str, broker: Any) -> None:
    """Make ``broker`` reachable as ``ladder-sim://<name>``.

    Raises:
        ValueError: another live broker already has that name.
    """
    with _lock:
        existing = _brokers.get(name)
        if existing is not None and existing is not broker:
            raise ValueError(f"a SimulatedBroker named {name!r} already exists in this process")
        _brokers[name] = broker


def lookup(name: str) -> Any:
    """Return the live broker registered as ``name``, or None."""
    with _lock:
        return _brokers.get(name or "")


def named(name: str, make: Callable[[str], Any]) -> Any:
    """Return the broker called ``name``, made with ``make(name)`` (and kept) if there is none."""
    with _lock:
        broker = _brokers.get(name)
        if broker is None:
            broker = _kept[name] = make(name)
        return broker
