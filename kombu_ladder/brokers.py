"""Which brokers the ladder runs on: RabbitMQ over AMQP 0-9-1, or the simulator."""

from __future__ import annotations

from typing import Mapping, Optional

from .errors import LadderError

__all__ = ["BROKER_ENVS", "DEFAULT_BROKER", "SCHEMES", "SIMULATOR", "UnsupportedBroker", "broker_url",
           "install_scheme", "require_rabbitmq"]

#: The broker used when none is given: RabbitMQ on this machine, as guest.
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"

#: The environment variables naming the broker when none is given, in the order they are read: the
#: ladder's own, then the one Celery reads (so ``kombu-ladder`` in a Celery project talks to its broker).
BROKER_ENVS = ("KOMBU_LADDER_BROKER", "CELERY_BROKER_URL")


def broker_url(given: Optional[str], environ: Mapping[str, str]) -> tuple[str, str]:
    """Return the broker URL to use and where it came from: ``given`` (``"--broker"``), else the first of
    :data:`BROKER_ENVS` set and not empty in ``environ`` (its name), else :data:`DEFAULT_BROKER` (``"default"``)."""
    if given is not None:
        return given, "--broker"
    for name in BROKER_ENVS:
        if environ.get(name):
            return environ[name], name
    return DEFAULT_BROKER, "default"


#: The simulator's URL scheme (see :mod:`kombu_ladder.simulator`).
SIMULATOR = "ladder-sim"

#: URL schemes (kombu transports) the ladder works on: py-amqp to RabbitMQ, and the simulator.
SCHEMES = ("amqp", "amqps", "pyamqp", SIMULATOR)

E_UNSUPPORTED = (
    "the ladder needs RabbitMQ (an amqp:// or amqps:// URL, or ladder-sim:// for the simulator), not {scheme}://: "
    "it is built on RabbitMQ's queue TTLs, dead-lettering and publisher confirms"
)
E_NOT_A_URL = ("{url!r} is not a broker URL: the ladder needs RabbitMQ, as an amqp:// or amqps:// URL such as "
               "amqp://guest:guest@localhost// (or ladder-sim:// for the simulator)")


class UnsupportedBroker(LadderError, ValueError):
    """A broker URL names a transport the ladder cannot run on (Redis, SQS, ``memory://``...)."""


def require_rabbitmq(url: str) -> None:
    """Refuse a broker URL whose transport is not RabbitMQ's (or the simulator's).

    Kombu's failover form (``amqp://a;amqp://b``) is checked URL by URL, and a
    ``transport+scheme://`` URL by its transport.

    Arguments:
        url: a kombu broker URL.

    Raises:
        UnsupportedBroker: the URL's transport is not in :data:`SCHEMES`, or it is no URL at all.
    """
    for part in url.split(";"):
        part = part.strip()
        if not part:
            continue
        if "://" not in part and part.lower() not in SCHEMES:  # kombu takes a bare transport name too
            raise UnsupportedBroker(E_NOT_A_URL.format(url=part))
        scheme = part.split("://", 1)[0]
        transport = scheme.split("+", 1)[0].lower()
        if transport not in SCHEMES:
            raise UnsupportedBroker(E_UNSUPPORTED.format(scheme=transport))


def install_scheme(scheme: str = SIMULATOR) -> None:
    """Make ``scheme://`` URLs resolve to the simulator's kombu transport (a name in kombu's table)."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES.setdefault(scheme, "kombu_ladder.simulator.transport:Transport")
