"""Which brokers the ladder runs on: RabbitMQ over AMQP 0-9-1, or the simulator."""

from __future__ import annotations

from .errors import LadderError

__all__ = ["DEFAULT_BROKER", "SCHEMES", "UnsupportedBroker", "require_rabbitmq"]

#: The broker used when none is given: RabbitMQ on this machine, as guest.
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"

#: URL schemes (kombu transports) the ladder works on: py-amqp to RabbitMQ, and the simulator.
SCHEMES = ("amqp", "amqps", "pyamqp", "ladder-sim")

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
