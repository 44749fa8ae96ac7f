"""Index records: what a producer of ours appends to ``ladder.index`` per scheduled message (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..contract import DUE_AT, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from ..controlplane import ENTRY, INDEX, MARKER
from ..controlplane import STREAM_ARGUMENTS as _STREAM_ARGUMENTS
from ..controlplane.codec import MAX_ENTRIES, MAX_ID_BYTES, MAX_INDEX_BYTES, MAX_NAME_BYTES, VERSION, Entries, Entry
from ..controlplane.codec import RecordError as IndexRecordError
from ..controlplane.codec import encode as encode_record
from ..plan import parse_due_at

__all__ = [
    "STREAM", "STREAM_ARGUMENTS", "VERSION", "KIND_BATCH", "KIND_MARKER", "MAX_RECORD_BYTES", "MAX_NAME_BYTES",
    "MAX_ENTRIES", "Entry", "IndexRecordError", "entry", "entry_of", "encode_batch",
]

#: The stream the index records go to. Ours, like ``ladder.cancellations``: no AceMQ peer reads or writes it,
#: and nothing in the contract's queues, headers or arguments changes when it is used.
STREAM = INDEX
#: Its arguments (the control plane's table). Retention matches ``ladder.cancellations``: past the longest
#: delay the ladder accepts.
STREAM_ARGUMENTS = dict(_STREAM_ARGUMENTS)
#: The ``ladder`` field of a batch of entries, and of a reader's catch-up marker.
KIND_BATCH = ENTRY.name
KIND_MARKER = MARKER.name
#: A record bigger than this is not one of ours: it is skipped unread.
MAX_RECORD_BYTES = MAX_INDEX_BYTES
#: An id of at most this many characters is within ``MAX_ID_BYTES`` however it encodes (4 bytes a character).
_SHORT_ID = MAX_ID_BYTES // 4


def entry(*, message_id: Any, task_id: Any, task: Any, exchange: str, routing_key: str, due: int, at: int,
          size: int) -> Entry:
    """An :class:`Entry` from a publish's values: an id or name that is not a str (or too long) is left out."""
    return Entry(_id(message_id), _id(task_id), _id(task), exchange, routing_key, due, at, max(0, size))


def _id(value: Any) -> Optional[str]:
    """An id or task name as a str (bytes decoded as UTF-8), or None when it is none (not text, empty, too long)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or not value:
        return None
    if len(value) <= _SHORT_ID or len(value.encode("utf-8", "surrogatepass")) <= MAX_ID_BYTES:
        return value  # a character is at most 4 bytes: a short one needs no encoding to be measured
    return None


def _name(value: Any) -> Optional[str]:
    """A target header as a name (bytes decoded as UTF-8), or None when it is none (not text, or too long)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return None
    return value


def entry_of(properties: Mapping[str, Any], headers: Mapping[str, Any], size: int, *, at: int,
             due: Optional[int] = None, was: Optional[int] = None) -> Optional[Entry]:
    """The entry of a message waiting in the ladder (its properties and ``x-schedule-*`` headers, as it sits in a
    rung or the control queue), as its producer would have written it: due at ``due`` (default: its
    ``x-schedule-due-at``), published at ``at``. None when it is not a valid ladder message (no target, a target
    that is not a short str, no due time): nothing is indexed for it.
    """
    exchange, routing_key = _name(headers.get(TARGET_EXCHANGE, "")), _name(headers.get(TARGET_ROUTING_KEY))
    if exchange is None or routing_key is None:
        return None
    due = parse_due_at(headers.get(DUE_AT)) if due is None else due
    if due is None or not 0 <= due < 2 ** 53:
        return None
    task = headers.get("task") if "id" in headers else None
    found = entry(message_id=properties.get("message_id"), task=task,
                  task_id=(properties.get("correlation_id") or headers.get("id")) if task is not None else None,
                  exchange=exchange, routing_key=routing_key, due=due, at=at, size=size)
    return found._replace(was=was) if was is not None else found


def encode_batch(entries: Sequence[Entry]) -> bytes:
    """Return the record (JSON bytes) holding ``entries``.

    Raises:
        ValueError: no entries, or more than :data:`MAX_ENTRIES`.
    """
    return encode_record(Entries(tuple(entries)))
