"""The control plane: one table of the ladder's own streams, record exchanges and bindings (pure: no I/O).

Every record kind has an exchange of its own, and a reader accepts a kind only from it: the
exchange the broker reports on a stream delivery is the one the record was published to
(RabbitMQ 3.10: ``""`` when written through the default exchange, which no header can change).
So write on a kind's exchange is the right to write that kind, and write on ``amq.default``
(which reaches every queue of the vhost by name) forges none. ``declare``, ``check`` and the
permission rows of :mod:`kombu_ladder.permissions` are all derived from this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["CANCELLATIONS", "INDEX", "ADOPTIONS", "SNAPSHOTS", "STREAM_ARGUMENTS", "SNAPSHOT_ARGUMENTS", "Stream",
           "Kind", "STREAMS", "KINDS", "CANCEL", "ENTRY", "ADOPTED", "SNAPSHOT", "SEAL", "MARKER", "NAMES",
           "kind", "is_control_plane", "accepts", "pattern",
           "PROBE_KEY", "READ_PREFETCH", "READ_TIMEOUT", "declare_control_plane"]

#: Retention of every control stream: past the longest delay the ladder accepts (ten years).
STREAM_ARGUMENTS: Mapping[str, object] = {"x-queue-type": "stream", "x-max-age": "11Y"}

#: The stream of cancellation records (read by every relay, and by the index's sync).
CANCELLATIONS = "ladder.cancellations"
#: The stream of the index of waiting work (entries of indexing producers).
INDEX = "ladder.index"
#: The stream of adoption records (Celery workers that adopt ETA tasks sent without the ladder).
ADOPTIONS = "ladder.adoptions"
#: The stream of snapshots of the live cancellations (written by relays, read by a relay that starts).
SNAPSHOTS = "ladder.snapshots"

#: Retention of the snapshot stream: short, since a start needs only the newest complete snapshot, which a
#: running relay writes at least every few minutes (:mod:`kombu_ladder.snapshots`). Six hours, capped at
#: 256 MiB; segments of 8 MiB, so that retention (which drops whole segments, never the one being
#: written) applies at that grain. The newest complete snapshot is always kept while relays run and a
#: snapshot is under about 240 MiB (three million live cancellations).
SNAPSHOT_ARGUMENTS: Mapping[str, object] = {"x-queue-type": "stream", "x-max-age": "6h",
                                            "x-max-length-bytes": 256 * 1024 * 1024,
                                            "x-stream-max-segment-size-bytes": 8 * 1024 * 1024}


@dataclass(frozen=True)
class Stream:
    """A durable stream of records."""

    name: str
    arguments: Mapping[str, object]


@dataclass(frozen=True)
class Kind:
    """A record kind: the value of its ``ladder`` field, and the one exchange it is written through."""

    #: The ``ladder`` field of its records.
    name: str
    #: The only exchange a reader accepts it from.
    exchange: str
    #: The streams it is bound to, each with its own name as the routing key.
    streams: tuple[str, ...]
    #: The exchange's type: direct, so that a record is routed by the stream's name, and anything else is
    #: unroutable (a write probe checks the right to publish without storing anything).
    type: str = "direct"


#: The streams, in the order ``declare`` creates them.
STREAMS = tuple([Stream(name, STREAM_ARGUMENTS) for name in (CANCELLATIONS, INDEX, ADOPTIONS)]
                + [Stream(SNAPSHOTS, SNAPSHOT_ARGUMENTS)])

#: A cancellation (``cancel``): the right to drop a waiting message.
CANCEL = Kind("cancel", "ladder.record.cancel", (CANCELLATIONS,))
#: An index batch (``index``): entries of waiting messages.
ENTRY = Kind("index", "ladder.record.index", (INDEX,))
#: An adoption record (``adopted``): a worker acks the original of an adopted task on it.
ADOPTED = Kind("adopted", "ladder.record.adopted", (ADOPTIONS,))
#: A part of a snapshot of the live cancellations (``snapshot``). Whoever may write one may un-cancel (a
#: forged snapshot that leaves an id out), so only the relay role writes it.
SNAPSHOT = Kind("snapshot", "ladder.record.snapshot", (SNAPSHOTS,))
#: The seal of a snapshot (``seal``): its part count and the cancellation offset it covers up to. A
#: snapshot without its seal is ignored. The relay role alone writes it, as it does the parts.
SEAL = Kind("seal", "ladder.record.seal", (SNAPSHOTS,))
#: A reader's catch-up marker (``marker``), into the stream its routing key names: harmless, a reader
#: acts only on its own (a random token) and skips any other.
MARKER = Kind("marker", "ladder.record.marker", (CANCELLATIONS, INDEX, ADOPTIONS, SNAPSHOTS))

#: Every kind, each with its exchange.
KINDS = (CANCEL, ENTRY, ADOPTED, SNAPSHOT, SEAL, MARKER)

#: Every control-plane name: the streams and the kinds' exchanges. No relay delivers to one, and no role
#: but the operator has configure on one.
NAMES = tuple([s.name for s in STREAMS] + [k.exchange for k in KINDS])


def kind(name: str) -> Kind:
    """The :class:`Kind` whose records carry ``ladder: name``.

    Raises:
        KeyError: no such kind.
    """
    for candidate in KINDS:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def is_control_plane(name: str) -> bool:
    """Whether ``name`` (an exchange, or a queue reached through the default exchange) is a control-plane name."""
    return name in NAMES


def accepts(kind_name: Any, exchange: Any) -> bool:
    """Whether a record of ``kind_name`` read from a stream was published through its kind's exchange.

    ``exchange`` is what the broker reported on the delivery (``delivery_info['exchange']``).
    """
    for candidate in KINDS:
        if candidate.name == kind_name:
            return exchange == candidate.exchange
    return False


#: Every reader's policy: records the broker may send at once (a stream consumer needs a prefetch), and the
#: seconds a reader waits to read a stream to its end (up to a marker of its own).
READ_PREFETCH = 2000
READ_TIMEOUT = 300.0

#: The routing key of a write probe: routed nowhere by any kind's exchange, so nothing is stored.
PROBE_KEY = "kombu-ladder.write-probe"


def pattern(*names: str) -> str:
    """A permission regexp alternative matching exactly ``names``."""
    return "|".join(re.escape(name) for name in names)


def declare_control_plane(channel: Any) -> None:
    """Declare every stream and kind exchange of the table, and bind them, on ``channel``.

    Needs configure on every control-plane name, write on the streams and read on the
    exchanges: the operator's row (:func:`kombu_ladder.permissions.operator`).
    """
    for stream in STREAMS:
        channel.queue_declare(queue=stream.name, durable=True, auto_delete=False, arguments=dict(stream.arguments))
    for record in KINDS:
        channel.exchange_declare(record.exchange, record.type, durable=True, auto_delete=False)
        for stream_name in record.streams:
            channel.queue_bind(stream_name, record.exchange, stream_name)
