"""Cancellation records and the set of live cancelled ids (pure: no kombu, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Optional

from ..controlplane import CANCEL, CANCELLATIONS, MARKER
from ..controlplane import STREAM_ARGUMENTS as _STREAM_ARGUMENTS
from ..controlplane.codec import KEYS, MAX_CANCEL_BYTES, MAX_ID_BYTES, VERSION, Cancel, RecordError, check_id
from ..controlplane.codec import Cancellation as Record
from ..controlplane.codec import encode as encode_record
from ..deaths import entered_rung_ms
from .liveset import LIFE, LONGEST_RUNG, MARGIN, SLACK, LiveSet

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
