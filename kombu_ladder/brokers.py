"""Which brokers the ladder runs on: RabbitMQ over AMQP 0-9-1, or the simulator."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from .errors import LadderError

__all__ = ["DEFAULT_BROKER", "SCHEMES", "SIMULATOR", "UnsupportedBroker", "clock_of", "install_scheme",
           "require_rabbitmq"]

#: The broker used when none is given: RabbitMQ on this machine, as guest.
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"

#: The simulator's URL scheme (see :mod:`kombu_ladder.simulator`).
SIMULATOR = "ladder-sim"

#: URL schemes (kombu transports) the ladder works on: py-amqp to RabbitMQ, and the simulator.
SCHEMES = ("amqp", "amqps", "pyamqp", SIMULATOR)

E_UNSUPPORTED = (
    "the ladder needs RabbitMQ (an amqp:// or amqps:// URL, or ladder-sim:// for the simulator), not {scheme}://: "
    "it is built on RabbitMQ's queue TTLs, dead-lettering and publisher confirms"
)


class UnsupportedBroker(LadderError, ValueError):
    """A broker URL names a transport the ladder cannot run on (Redis, SQS, ``memory://``...)."""


def require_rabbitmq(url: str) -> None:
    """Refuse a broker URL whose transport is not RabbitMQ's (or the simulator's).

    Kombu's failover form (``amqp://a;amqp://b``) is checked URL by URL, and a
    ``transport+scheme://`` URL by its transport.

    Arguments:
        url: a kombu broker URL.

    Raises:
        UnsupportedBroker: the URL's transport is not in :data:`SCHEMES`.
    """
    for part in url.split(";"):
        part = part.strip()
        if not part:
            continue
        scheme = part.split("://", 1)[0] if "://" in part else part
        transport = scheme.split("+", 1)[0].lower()
        if transport not in SCHEMES:
            raise UnsupportedBroker(E_UNSUPPORTED.format(scheme=transport))


def clock_of(connection: Any, given: Optional[Callable[[], float]] = None, *,
             default: Optional[Callable[[], float]] = time.time) -> Any:
    """The clock to stamp due times with on ``connection``: ``given`` if any, else the simulator's
    virtual clock on a ``ladder-sim://`` connection, else ``default``."""
    if given is not None:
        return given
    virtual = getattr(getattr(connection, "transport", None), "virtual_clock", None)
    return virtual if virtual is not None else default


def install_scheme(scheme: str = SIMULATOR) -> None:
    """Make ``scheme://`` URLs resolve to the simulator's kombu transport (a name in kombu's table)."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES.setdefault(scheme, "kombu_ladder.simulator.transport:Transport")
