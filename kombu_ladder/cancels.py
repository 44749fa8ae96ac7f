"""Cancellation records and the set of live cancelled ids (pure: no kombu, no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "STREAM", "STREAM_ARGUMENTS", "MARGIN", "MAX_ID_BYTES", "MAX_RECORD_BYTES", "Record", "RecordError",
    "LiveSet", "encode", "encode_marker", "decode", "check_id",
]

#: The durable stream that holds every cancellation record. An extension of ours: it is not an
#: AceMQ contract name (``acemq.schedule*`` is the contract's), and no AceMQ peer reads it.
STREAM = "ladder.cancellations"
#: Its arguments. Retention (``x-max-age``) is longer than the longest delay the ladder accepts
#: (:data:`kombu_ladder.plan.MAX_DELAY`, ten years): a record outlives the message it cancels.
STREAM_ARGUMENTS = {"x-queue-type": "stream", "x-max-age": "11Y"}
#: How long (ms) past its message's due time a record stays live: a message may reach a relay
#: a little after its due time (a relay restart, a backlog), and must still be dropped then.
MARGIN = 24 * 3600 * 1000
#: The longest an AMQP ``message_id`` may be (a shortstr), in UTF-8 bytes.
MAX_ID_BYTES = 255
#: A record bigger than this is not one of ours: it is skipped unread.
MAX_RECORD_BYTES = 4096
#: The ``ladder`` field of a cancellation, and of the marker a relay writes to know it has caught up.
KIND_CANCEL = "cancel"
KIND_MARKER = "marker"
#: What a cancellation's id is matched against: the AMQP ``message_id`` (Kombu), or the Celery task id,
#: which Celery sends as the ``correlation_id`` of a task message (and not as its ``message_id``).
KEYS = ("message_id", "task_id")
#: The record format's version.
VERSION = 1


class RecordError(ValueError):
    """A record on the stream that is not a valid cancellation (the reason is the message)."""


@dataclass(frozen=True)
class Record:
    """One decoded record: a cancellation of ``id``, or a relay's catch-up ``marker``."""

    kind: str
    id: str
    #: When it was written (epoch ms).
    at: int
    #: The cancelled message's due time (epoch ms), when the canceller knew it.
    due: Optional[int] = None
    #: What ``id`` is: one of :data:`KEYS`.
    key: str = "message_id"


def check_id(message_id: Any, *, argument: str = "message_id") -> str:
    """Return ``message_id`` if it can be an AMQP message id (a non-empty str of at most 255 UTF-8 bytes).

    Raises:
        TypeError: it is not a str.
        ValueError: it is empty or too long.
    """
    if not isinstance(message_id, str):
        raise TypeError(f"{argument} must be a str, not {type(message_id).__name__}")
    if not message_id:
        raise ValueError(f"{argument} must not be empty")
    if len(message_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValueError(f"{argument} is longer than {MAX_ID_BYTES} bytes in UTF-8, which no AMQP message id can be")
    return message_id


def _millis(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 53:
        raise RecordError(f"field {field!r} must be epoch milliseconds (a non-negative integer), not {value!r:.40}")
    return value


def encode(message_id: str, *, at: int, due: Optional[int] = None, key: str = "message_id") -> bytes:
    """Return the record (JSON bytes) cancelling ``message_id``, written at ``at`` (epoch ms).

    ``key`` says what the id is matched against (see :data:`KEYS`).
    """
    check_id(message_id)
    if key not in KEYS:
        raise ValueError(f"key must be one of {', '.join(KEYS)}, not {key!r}")
    record: dict[str, Any] = {"ladder": KIND_CANCEL, "v": VERSION, "id": message_id, "at": _millis(at, "at")}
    if key != "message_id":
        record["key"] = key
    if due is not None:
        record["due"] = _millis(due, "due")
    return json.dumps(record, separators=(",", ":")).encode("utf-8")


def encode_marker(token: str, *, at: int) -> bytes:
    """Return a catch-up marker: a relay that reads its own marker has read every earlier record."""
    return json.dumps({"ladder": KIND_MARKER, "v": VERSION, "id": token, "at": _millis(at, "at")},
                      separators=(",", ":")).encode("utf-8")


def decode(body: Any) -> Record:
    """Read one untrusted record from the stream.

    Raises:
        RecordError: it is not a valid record (too big, not JSON, a wrong field); the reason says which.
    """
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise RecordError(f"its body is a {type(body).__name__}, not bytes")
    if len(body) > MAX_RECORD_BYTES:
        raise RecordError(f"it is {len(body)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        record = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(f"its body is not UTF-8 JSON: {type(exc).__name__}") from None
    if not isinstance(record, dict):
        raise RecordError("its body is not a JSON object")
    kind = record.get("ladder")
    if kind not in (KIND_CANCEL, KIND_MARKER):
        raise RecordError(f"field 'ladder' must be 'cancel' or 'marker', not {kind!r:.40}")
    if record.get("v") != VERSION or isinstance(record.get("v"), bool):
        raise RecordError(f"field 'v' must be {VERSION}, not {record.get('v')!r:.40}")
    try:
        message_id = check_id(record.get("id"), argument="field 'id'")
    except (TypeError, ValueError) as exc:
        raise RecordError(str(exc)) from None
    due = record.get("due")
    key = record.get("key", "message_id")
    if key not in KEYS:
        raise RecordError(f"field 'key' must be one of {', '.join(KEYS)}, not {key!r:.40}")
    return Record(kind, message_id, _millis(record.get("at"), "at"), None if due is None else _millis(due, "due"),
                  key)


class LiveSet:
    """The ids of the live cancellations, each until its expiry (epoch ms).

    A record whose message's due time is known lives until that due time plus
    :data:`MARGIN`; one without lives until it was written plus ``horizon_ms``
    (the longest delay accepted), since its message can be due no later.
    :meth:`prune` forgets the expired ones; it scans the whole set, so callers
    run it now and then (see ``prune_every_ms``), not per message.
    """

    def __init__(self, *, horizon_ms: int, margin_ms: int = MARGIN, prune_every_ms: int = 60_000) -> None:
        if horizon_ms < 0 or margin_ms < 0:
            raise ValueError("horizon_ms and margin_ms must not be negative")
        self.horizon_ms = horizon_ms
        self.margin_ms = margin_ms
        self.prune_every_ms = prune_every_ms
        self._until: dict[str, int] = {}
        self._next_prune = 0

    def expiry(self, record: Record) -> int:
        """When (epoch ms) ``record``'s cancellation stops mattering."""
        if record.due is not None:
            return record.due + self.margin_ms
        return record.at + self.horizon_ms + self.margin_ms

    def add(self, record: Record, now: int) -> bool:
        """Keep ``record``'s cancellation; False (not kept) if it has expired already."""
        until = self.expiry(record)
        if until <= now:
            return False
        if until > self._until.get(record.id, 0):
            self._until[record.id] = until
        return True

    def cancelled(self, message_id: Any, now: int) -> bool:
        """Whether a message with this id is cancelled at ``now`` (epoch ms)."""
        if not isinstance(message_id, str):
            return False
        until = self._until.get(message_id)
        return until is not None and until > now

    def prune(self, now: int, *, force: bool = False) -> int:
        """Forget the expired cancellations (at most once per ``prune_every_ms`` unless forced); return how many."""
        if not force and now < self._next_prune:
            return 0
        self._next_prune = now + self.prune_every_ms
        expired = [key for key, until in self._until.items() if until <= now]
        for key in expired:
            del self._until[key]
        return len(expired)

    def __len__(self) -> int:
        return len(self._until)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._until
