"""Cancellation records and the set of live cancelled ids (pure: no kombu, no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, Optional

from ..contract import RUNGS
from ..controlplane import CANCEL, CANCELLATIONS, MARKER
from ..controlplane import STREAM_ARGUMENTS as _STREAM_ARGUMENTS
from ..controlplane.codec import KEYS, MAX_CANCEL_BYTES, MAX_ID_BYTES, VERSION, Cancel, RecordError, check_id
from ..controlplane.codec import Cancellation as Record
from ..controlplane.codec import encode as encode_record
from ..deaths import entered_rung_ms

__all__ = [
    "STREAM", "STREAM_ARGUMENTS", "STREAM_EXCHANGE", "STREAM_EXCHANGE_TYPE", "MARGIN", "SLACK", "LONGEST_RUNG",
    "LIFE", "MAX_ID_BYTES", "MAX_RECORD_BYTES", "KEYS", "VERSION", "Record", "RecordError", "LiveSet", "encode",
    "check_id", "READ_BACK_MS", "CELERY_TASK_HEADER", "read_from", "cancelled_id",
]

#: The durable stream that holds every cancellation record. An extension of ours: it is not an
#: AceMQ contract name (``acemq.schedule*`` is the contract's), and no AceMQ peer reads it.
STREAM = CANCELLATIONS
#: Its arguments (the control plane's table: see :mod:`kombu_ladder.controlplane`). Retention (``x-max-age``)
#: is longer than the longest delay the ladder accepts; what a relay *reads* is bounded instead: the
#: records of the last :data:`LIFE` (see ``relay.cancelwatch``).
STREAM_ARGUMENTS = dict(_STREAM_ARGUMENTS)
#: The exchange cancellers publish their records to, bound to the stream: writing it is the right to
#: cancel, and nothing more. A reader accepts a cancellation only from it (a record written through the
#: default exchange, which reaches every queue of the vhost by name, is skipped).
STREAM_EXCHANGE = CANCEL.exchange
#: Its type (direct: the stream's name is the routing key).
STREAM_EXCHANGE_TYPE = CANCEL.type
#: How long (ms) a message may wait in ``acemq.schedule.due`` before a relay takes it (every relay
#: down, a backlog) and still be dropped when its cancellation is: past its due time, or past the
#: moment it left its rung.
MARGIN = 24 * 3600 * 1000
#: The longest (ms) a waiting message goes without reaching a relay: the longest rung's TTL. A message
#: waiting when a cancellation is written leaves its rung within this.
LONGEST_RUNG = max(RUNGS) * 1000
#: How far (ms) the clocks of a canceller and of the broker may disagree, and how late a relay may
#: read a record it races with: a message that entered its rung up to this long *after* a
#: cancellation was written still counts as waiting when it was.
SLACK = 30 * 1000
#: How long (ms) after it was written a record can still drop a message: the message was waiting then,
#: so it left its rung within :data:`LONGEST_RUNG` (plus :data:`SLACK`), and a relay took it within
#: :data:`MARGIN` of that. An older record can match nothing, and a relay need not read it.
LIFE = LONGEST_RUNG + SLACK + MARGIN
#: A record bigger than this is not one of ours: it is skipped unread (a batch of ids: see the codec).
MAX_RECORD_BYTES = MAX_CANCEL_BYTES
#: The ``ladder`` field of a cancellation, and of a reader's catch-up marker.
KIND_CANCEL = CANCEL.name
KIND_MARKER = MARKER.name


def encode(message_id: str, *, at: int, due: Optional[int] = None, key: str = "message_id") -> bytes:
    """Return the record (JSON bytes) cancelling ``message_id`` alone, written at ``at`` (epoch ms).

    ``key`` says what the id is matched against (see :data:`KEYS`). :func:`~kombu_ladder.cancel_many` writes
    batches (:func:`~kombu_ladder.controlplane.codec.pack_ids`).
    """
    check_id(message_id)
    return encode_record(Cancel((message_id,), at, due, key))


class LiveSet:
    """The ids of the live cancellations: each with when it was written and until when it lives (epoch ms).

    A record lives until it was written plus :data:`LIFE`, or its message's due
    time plus :data:`MARGIN` when the canceller knew it and that is sooner. It
    cancels only a message that was waiting when it was written: one that
    entered its current rung no later than the record was written plus
    :data:`SLACK` (see :meth:`cancelled`); a message with the same id
    scheduled later is not its business. :meth:`prune` forgets the expired
    ones; it scans the whole set, so callers run it now and then (see
    ``prune_every_ms``), not per message.
    """

    def __init__(self, *, margin_ms: int = MARGIN, slack_ms: int = SLACK, life_ms: int = LIFE,
                 prune_every_ms: int = 60_000) -> None:
        if margin_ms < 0 or slack_ms < 0 or life_ms < 0:
            raise ValueError("margin_ms, slack_ms and life_ms must not be negative")
        self.margin_ms = margin_ms
        self.slack_ms = slack_ms
        self.life_ms = life_ms
        self.prune_every_ms = prune_every_ms
        #: id -> (the latest time a record for it was written, the latest expiry of those records).
        self._records: dict[str, tuple[int, int]] = {}
        self._next_prune = 0

    def expiry(self, record: Record) -> int:
        """When (epoch ms) ``record``'s cancellation stops mattering."""
        until = record.at + self.life_ms
        if record.due is not None:
            until = min(until, record.due + self.margin_ms)
        return until

    def add(self, record: Record, now: int) -> bool:
        """Keep ``record``'s cancellation; False (not kept) if it has expired already.

        Several live records for one id are kept as one: the latest written and
        the latest expiry (which errs toward cancelling, never toward delivering).
        """
        until = self.expiry(record)
        if until <= now:
            return False
        at, old_until = self._records.get(record.id, (record.at, until))
        self._records[record.id] = (max(at, record.at), max(old_until, until))
        return True

    def cancelled(self, message_id: Any, now: int, *, entered: Optional[int] = None) -> bool:
        """Whether a message with this id is cancelled at ``now`` (epoch ms).

        ``entered`` is when the message entered the rung it just left (epoch ms),
        when known: a message that entered it later than the record was written
        (plus :data:`SLACK`) was scheduled after the cancellation, and is not
        cancelled by it. Unknown (None), the id alone decides.
        """
        if not isinstance(message_id, str):
            return False
        found = self._records.get(message_id)
        if found is None or found[1] <= now:
            return False
        return entered is None or entered <= found[0] + self.slack_ms

    def prune(self, now: int, *, force: bool = False) -> int:
        """Forget the expired cancellations (at most once per ``prune_every_ms`` unless forced); return how many."""
        if not force and now < self._next_prune:
            return 0
        self._next_prune = now + self.prune_every_ms
        expired = [key for key, (_, until) in self._records.items() if until <= now]
        for key in expired:
            del self._records[key]
        return len(expired)

    def entries(self) -> list[tuple[str, int, int]]:
        """Every live cancellation as ``(id, written, until)`` (epoch ms): what a snapshot holds."""
        return [(key, at, until) for key, (at, until) in self._records.items()]

    def restore(self, entries: Iterable[tuple[str, int, int]], now: int) -> int:
        """Keep the cancellations of a snapshot (see :meth:`entries`) that live past ``now``; return how many.

        An id already kept keeps the latest written and the latest expiry of the two, as :meth:`add` does.
        """
        kept = 0
        for key, at, until in entries:
            if until <= now:
                continue
            old_at, old_until = self._records.get(key, (at, until))
            self._records[key] = (max(at, old_at), max(until, old_until))
            kept += 1
        return kept

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._records


#: How far back (ms) a relay starts reading the stream: a record older than
#: :data:`~kombu_ladder.cancellation.records.LIFE` can drop no message, and
#: :data:`~kombu_ladder.cancellation.records.SLACK` more covers a canceller's clock ahead of the broker's
#: (whose append time the offset is). The stream's retention is not changed (it is part of the topology
#: every relay declares); what a relay reads is bounded instead.
READ_BACK_MS = LIFE + SLACK
#: The header that makes a message a Celery task message (protocol 2), whose ``correlation_id`` is its task id.
CELERY_TASK_HEADER = "task"


def read_from(now: float) -> datetime:
    """The stream offset to read the records that can still matter from, at ``now`` (epoch seconds)."""
    start = max(0, int(now * 1000) - READ_BACK_MS) // 1000
    return datetime.fromtimestamp(start, tz=timezone.utc)


def cancelled_id(live: LiveSet, now: int, message_id: Any, correlation_id: Any = None,
                 headers: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    """The id under which ``live`` cancels a message with these properties at ``now``, or None.

    See :meth:`kombu_ladder.relay.cancelwatch.CancelWatch.cancelled` for the rule (what an id matches, and
    when the message must have entered its rung).
    """
    for value, needs_task in ((message_id, False), (correlation_id, True)):
        text = _text(value)
        if text is None or text not in live:
            continue
        if needs_task and (headers is None or CELERY_TASK_HEADER not in headers):
            continue
        if live.cancelled(text, now, entered=entered_rung_ms(headers)):
            return text
    return None


def _text(value: Any) -> Optional[str]:
    """A property as text (bytes as on the wire decoded as UTF-8), or None."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) and value else None
