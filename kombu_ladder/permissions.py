"""The minimal RabbitMQ permissions (configure, write, read regexps) of each ladder role."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

__all__ = ["LADDER_NAMES", "CANCELLATIONS", "Permissions", "producer", "relay", "operator", "canceller", "union"]

#: Every name the ladder declares: the exchange, the five rungs, the control and parking queues.
LADDER_NAMES = r"acemq\.schedule(\..+)?"

#: The cancellation stream (an extension of this library, see kombu_ladder.cancels).
CANCELLATIONS = r"ladder\.cancellations"

#: RabbitMQ's name for the default exchange ("" in AMQP), as permissions see it.
_DEFAULT_EXCHANGE = r"amq\.default"


@dataclass(frozen=True)
class Permissions:
    """Regexps for ``rabbitmqctl set_permissions -p VHOST USER CONF WRITE READ``."""

    configure: str
    write: str
    read: str

    def as_args(self) -> tuple[str, str, str]:
        """Return ``(configure, write, read)``, in ``rabbitmqctl``'s order."""
        return (self.configure, self.write, self.read)


def _anchor(*alternatives: str) -> str:
    return "^(" + "|".join(a for a in alternatives if a) + ")$"


def _exchanges(names: Iterable[str]) -> list[str]:
    if isinstance(names, str):
        raise TypeError("targets must be an iterable of exchange names, not a str")
    out = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"targets must be exchange names (str), not {name!r}")
        out.append(_DEFAULT_EXCHANGE if name == "" else re.escape(name))
    return out


def producer(targets: Iterable[str]) -> Permissions:
    """A publisher that schedules into the ladder.

    It declares the ladder (configure; RabbitMQ also wants read on a queue and
    write on its dead-letter exchange to declare it with one), binds the rungs
    (write on them, read on the exchange), publishes into ``acemq.schedule``,
    and publishes straight to its ``targets`` when a delay is under a second.
    It may declare ``ladder.cancellations``; to record cancellations too
    (``Scheduler.cancel``, a Celery revoke) add :func:`canceller`.

    Arguments:
        targets: the exchanges it schedules for; ``""`` is the default exchange.
    """
    return Permissions(_anchor(LADDER_NAMES, CANCELLATIONS), _anchor(LADDER_NAMES, *_exchanges(targets)),
                       _anchor(LADDER_NAMES))


def relay(targets: Iterable[str]) -> Permissions:
    """A relay (standalone, or the worker's bootstep) delivering only to ``targets``.

    It declares the ladder, consumes ``acemq.schedule.due``, hops into rungs,
    parks through the default exchange (so it needs ``amq.default``; keep ``""``
    out of the allow-list unless deliveries to queues by name are wanted) and
    delivers to ``targets``. Give the same names to ``--allow-exchange`` /
    ``ladder_allowed_exchanges``. It reads ``ladder.cancellations`` from its
    start (configure and read; its marker goes through ``amq.default``).
    """
    return Permissions(_anchor(LADDER_NAMES, CANCELLATIONS),
                       _anchor(LADDER_NAMES, _DEFAULT_EXCHANGE, *_exchanges(targets)),
                       _anchor(LADDER_NAMES, CANCELLATIONS))


def operator(targets: Iterable[str] = ()) -> Permissions:
    """Whoever runs ``status``, ``replay`` and ``cancel``: the same rights as a relay (parking is a ladder name)."""
    return relay(targets)


def canceller() -> Permissions:
    """Whoever records cancellations: it declares ``ladder.cancellations`` and publishes to it
    through the default exchange (``amq.default``). Join it to a producer's with :func:`union`."""
    return Permissions(_anchor(CANCELLATIONS), _anchor(_DEFAULT_EXCHANGE), "^$")


def union(*permissions: Permissions) -> Permissions:
    """Combine roles held by one user, e.g. a Celery worker's own permissions and a relay's."""
    return Permissions(*("|".join(p.as_args()[i] for p in permissions) for i in range(3)))
