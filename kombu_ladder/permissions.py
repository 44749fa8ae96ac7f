"""The minimal RabbitMQ permissions (configure, write, read regexps) of each ladder role."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from . import controlplane

__all__ = ["LADDER_NAMES", "LADDER_EXCHANGE", "CANCELLATIONS", "ADOPTIONS", "INDEX", "CONTROL_PLANE", "CANCEL_EXCHANGE",
           "ENTRY_EXCHANGE", "ADOPTED_EXCHANGE", "MARKER_EXCHANGE",
           "SNAPSHOTS", "SNAPSHOT_EXCHANGES", "Permissions", "producer", "relay", "operator",
           "canceller", "adopter", "indexer", "index_reader", "union"]

#: Every name the ladder declares: the exchange, the five rungs, the control and parking queues.
LADDER_NAMES = r"acemq\.schedule(\..+)?"

#: The ladder's exchange alone: publishing into a rung (or the control queue) goes through it.
LADDER_EXCHANGE = r"acemq\.schedule"

#: The control plane's names (streams, and the exchange of each record kind), from its one table
#: (:mod:`kombu_ladder.controlplane`): no role but the operator has configure on one, and a kind is
#: written only through its own exchange (readers accept it from no other).
CANCELLATIONS = re.escape(controlplane.CANCELLATIONS)
ADOPTIONS = re.escape(controlplane.ADOPTIONS)
INDEX = re.escape(controlplane.INDEX)
SNAPSHOTS = re.escape(controlplane.SNAPSHOTS)
CONTROL_PLANE = controlplane.pattern(*controlplane.NAMES)
#: The exchange of each kind: write on it is the right to write that kind.
CANCEL_EXCHANGE = re.escape(controlplane.CANCEL.exchange)
ENTRY_EXCHANGE = re.escape(controlplane.ENTRY.exchange)
ADOPTED_EXCHANGE = re.escape(controlplane.ADOPTED.exchange)
MARKER_EXCHANGE = re.escape(controlplane.MARKER.exchange)
#: The snapshot kinds' exchanges: the relay role's alone (a forged snapshot can un-cancel).
SNAPSHOT_EXCHANGES = controlplane.pattern(controlplane.SNAPSHOT.exchange, controlplane.SEAL.exchange)

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
        if controlplane.is_control_plane(name):
            raise ValueError(f"targets must not name the control plane's exchange {name!r}: writing it is a role "
                             f"of its own (canceller, indexer, adopter)")
        out.append(_DEFAULT_EXCHANGE if name == "" else re.escape(name))
    return out


def producer(targets: Iterable[str]) -> Permissions:
    """A publisher that schedules into the ladder, and nothing more.

    It publishes into the rungs through ``acemq.schedule`` (write on that exchange
    alone), and straight to its ``targets`` when a delay is under a second. It
    configures nothing, so it can neither declare nor delete a rung or a stream of the
    control plane: the ladder must be declared by the operator (``kombu-ladder
    declare``) or a relay first, which the producer then finds with passive declares.
    It reads nothing. To record cancellations too (``Scheduler.cancel``, a Celery
    revoke) add :func:`canceller`. A ``""`` among the targets is the default exchange,
    which reaches every queue of the vhost by name: it may write into a stream, but a
    reader accepts no record written that way.

    Arguments:
        targets: the exchanges it schedules for; ``""`` is the default exchange.

    Raises:
        ValueError: a target is a control-plane exchange.
    """
    return Permissions("^$", _anchor(LADDER_EXCHANGE, *_exchanges(targets)), "^$")


def relay(targets: Iterable[str]) -> Permissions:
    """A relay (standalone, or the worker's bootstep) delivering only to ``targets``.

    It declares the ladder, consumes ``acemq.schedule.due``, hops into rungs,
    parks through the default exchange (so it needs ``amq.default``; keep ``""``
    out of the allow-list unless deliveries to queues by name are wanted) and
    delivers to ``targets``. Give the same names to ``--allow-exchange`` /
    ``ladder_allowed_exchanges``. It reads ``ladder.cancellations`` and ``ladder.snapshots``
    (read only: the operator declares them), writes its catch-up markers through the marker
    exchange, and writes snapshots of the live cancellations through ``ladder.record.snapshot``
    and ``ladder.record.seal``: the only role that may, since a forged snapshot can un-cancel.
    """
    return Permissions(_anchor(LADDER_NAMES),
                       _anchor(LADDER_NAMES, _DEFAULT_EXCHANGE, MARKER_EXCHANGE, SNAPSHOT_EXCHANGES,
                               *_exchanges(targets)),
                       _anchor(LADDER_NAMES, CANCELLATIONS, SNAPSHOTS))


def operator(targets: Iterable[str] = ()) -> Permissions:
    """Whoever runs ``declare``, ``status``, ``check``, ``replay``, ``move`` and ``cancel``: a relay's rights,
    plus every right on the control plane: ``declare`` creates its streams and exchanges and binds them
    (write on a stream, read on an exchange), ``cancel`` and ``move`` write records."""
    return Permissions(_anchor(LADDER_NAMES, CONTROL_PLANE),
                       _anchor(LADDER_NAMES, _DEFAULT_EXCHANGE, CONTROL_PLANE, *_exchanges(targets)),
                       _anchor(LADDER_NAMES, CONTROL_PLANE))


def canceller() -> Permissions:
    """Whoever records cancellations: it publishes to the exchange ``ladder.record.cancel``, bound to the
    stream by the operator's ``declare``, and may do nothing else (it cannot read, declare or delete the
    stream, nor write into any other queue). Join it to a producer's with :func:`union`."""
    return Permissions("^$", _anchor(CANCEL_EXCHANGE), "^$")


def adopter() -> Permissions:
    """A Celery worker that adopts ETA tasks sent without the ladder (and ``celery ladder adopt``).

    It reads the stream ``ladder.adoptions`` and writes its records through the exchange
    ``ladder.record.adopted`` (its catch-up markers through ``ladder.record.marker``); it
    publishes the copies into the rungs through ``acemq.schedule``, where it finds the
    ladder declared (passively) as a producer does. It declares nothing of the control plane.
    Join it to the worker's own permissions and the relay's with :func:`union`.
    """
    return Permissions("^$", _anchor(LADDER_EXCHANGE, ADOPTED_EXCHANGE, MARKER_EXCHANGE), _anchor(ADOPTIONS))


def indexer() -> Permissions:
    """A producer that indexes what it schedules (``index=True``, Celery's ``ladder_index``), beyond its producer row.

    It appends its entries through the exchange ``ladder.record.index``, declared and bound
    to ``ladder.index`` by the operator, and may do nothing else. It reads nothing.
    Join it to the producer's row with :func:`union`. Without it the producer schedules
    as always, unindexed, and says so once on the ``kombu_ladder.index`` logger.
    """
    return Permissions("^$", _anchor(ENTRY_EXCHANGE), "^$")


def index_reader() -> Permissions:
    """Whoever reads the index: ``kombu-ladder waiting``, ``celery ladder waiting``, bulk ``cancel``, the console.

    Each sync reads ``ladder.index`` and ``ladder.cancellations`` from an offset (read),
    and appends a marker to each through ``ladder.record.marker`` to know when it has
    read everything before it. A bulk cancel records its cancellations as a canceller
    does: join :func:`canceller` (or the operator's row) with :func:`union`.
    """
    return Permissions("^$", _anchor(MARKER_EXCHANGE), _anchor(INDEX, CANCELLATIONS))


def union(*permissions: Permissions) -> Permissions:
    """Combine roles held by one user, e.g. a Celery worker's own permissions and a relay's."""
    return Permissions(*("|".join(p.as_args()[i] for p in permissions) for i in range(3)))
