"""Index records: what a producer of ours appends to ``ladder.index`` per scheduled message (pure: no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from ..cancellation.records import MAX_ID_BYTES
from ..contract import DUE_AT, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from ..controlplane import ENTRY, INDEX, MARKER
from ..controlplane import STREAM_ARGUMENTS as _STREAM_ARGUMENTS
from ..jsonrecords import load_object, millis
from ..plan import parse_due_at

__all__ = [
    "STREAM", "STREAM_ARGUMENTS", "VERSION", "KIND_BATCH", "KIND_MARKER", "MAX_RECORD_BYTES", "MAX_NAME_BYTES",
    "Entry", "Batch", "IndexRecordError", "entry", "entry_of", "encode_batch", "encode_marker", "decode",
]

#: The stream the index records go to. Ours, like ``ladder.cancellations``: no AceMQ peer reads or writes it,
#: and nothing in the contract's queues, headers or arguments changes when it is used.
STREAM = INDEX
#: Its arguments (the control plane's table). Retention matches ``ladder.cancellations``: past the longest
#: delay the ladder accepts.
STREAM_ARGUMENTS = dict(_STREAM_ARGUMENTS)
#: The record format's version.
VERSION = 1
#: The ``ladder`` field of a batch of entries, and of a reader's catch-up marker.
KIND_BATCH = ENTRY.name
KIND_MARKER = MARKER.name
#: A record bigger than this is not one of ours: it is skipped unread (a full batch is about 40 KB).
MAX_RECORD_BYTES = 1 << 20
#: The longest a task name, exchange or routing key may be (AMQP shortstr), in UTF-8 bytes.
MAX_NAME_BYTES = 255
#: The most entries one batch record holds (a writer flushes before).
MAX_ENTRIES = 1000
#: An id of at most this many characters is within ``MAX_ID_BYTES`` however it encodes (4 bytes a character).
_SHORT_ID = MAX_ID_BYTES // 4


class IndexRecordError(ValueError):
    """A record on ``ladder.index`` that is not a valid one (the reason is the message)."""


class Entry(NamedTuple):
    """One scheduled message, as its producer saw it when it published it into a rung.

    A named tuple rather than a frozen dataclass: a producer with the index on makes one per publish,
    and a tuple is made in a third of the time (the index's cost is measured in :doc:`/benchmarks`).
    """

    #: The AMQP ``message_id`` (None when it had none).
    message_id: Optional[str]
    #: The Celery task id (a task message's ``correlation_id``), None for a message that is no task.
    task_id: Optional[str]
    #: The Celery task name (the ``task`` header), None for a message that is no task.
    task: Optional[str]
    #: Where it will be delivered.
    exchange: str
    routing_key: str
    #: When it falls due (epoch ms).
    due: int
    #: When it was published (epoch ms, the producer's clock).
    at: int
    #: Its body's size in bytes.
    size: int
    #: For the entry of a rescheduled (or run-now) copy, the due time it replaces (epoch ms): the entry of that
    #: id due then, published no later than this one (plus the slack), is superseded. None for a scheduled message.
    was: Optional[int] = None


@dataclass(frozen=True)
class Batch:
    """One decoded record: a batch of entries, or a reader's catch-up ``marker`` (``token`` set)."""

    kind: str
    entries: tuple[Entry, ...] = ()
    token: Optional[str] = None


def _text(value: Any, field: str, *, limit: int, optional: bool = True) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > limit:
        raise IndexRecordError(f"field {field!r} must be a str of at most {limit} bytes, not {value!r:.40}")
    return value


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


def _entry_object(item: Entry) -> dict[str, Any]:
    message_id, task_id, task, exchange, routing_key, due, at, size, was = item
    found: dict[str, Any] = {"e": exchange, "r": routing_key, "d": due, "a": at, "s": size}
    if message_id is not None:
        found["m"] = message_id
    if task_id is not None:
        found["c"] = task_id
    if task is not None:
        found["t"] = task
    if was is not None:
        found["w"] = was
    return found


def encode_batch(entries: Sequence[Entry]) -> bytes:
    """Return the record (JSON bytes) holding ``entries``.

    Raises:
        ValueError: no entries, or more than :data:`MAX_ENTRIES`.
    """
    if not entries or len(entries) > MAX_ENTRIES:
        raise ValueError(f"a batch holds 1 to {MAX_ENTRIES} entries, not {len(entries)}")
    return json.dumps({"ladder": KIND_BATCH, "v": VERSION, "n": [_entry_object(e) for e in entries]},
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def encode_marker(token: str, *, at: int) -> bytes:
    """Return a catch-up marker: a reader that reads its own marker has read every earlier record."""
    return json.dumps({"ladder": KIND_MARKER, "v": VERSION, "id": token, "at": at},
                      separators=(",", ":")).encode("utf-8")


def _decode_entry(found: Any, index: int) -> Entry:
    if not isinstance(found, dict):
        raise IndexRecordError(f"entry {index} is not a JSON object")
    where = f"n[{index}]."
    size = found.get("s", 0)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 2 ** 53:
        raise IndexRecordError(f"field {where + 's'!r} must be a byte count, not {size!r:.40}")
    return Entry(
        _text(found.get("m"), where + "m", limit=MAX_ID_BYTES),
        _text(found.get("c"), where + "c", limit=MAX_ID_BYTES),
        _text(found.get("t"), where + "t", limit=MAX_NAME_BYTES),
        _text(found.get("e"), where + "e", limit=MAX_NAME_BYTES, optional=False) or "",
        _text(found.get("r"), where + "r", limit=MAX_NAME_BYTES, optional=False) or "",
        millis(found.get("d"), where + "d", error=IndexRecordError),
        millis(found.get("a"), where + "a", error=IndexRecordError),
        size,
        None if found.get("w") is None else millis(found.get("w"), where + "w", error=IndexRecordError),
    )


def decode(body: Any) -> Batch:
    """Read one untrusted record from ``ladder.index``.

    A batch with one bad entry is refused whole: its writer is not one of ours.

    Raises:
        IndexRecordError: it is not a valid record (too big, not JSON, a wrong field); the reason says which.
    """
    record = load_object(body, max_bytes=MAX_RECORD_BYTES, error=IndexRecordError)
    kind = record.get("ladder")
    if kind not in (KIND_BATCH, KIND_MARKER):
        raise IndexRecordError(f"field 'ladder' must be 'index' or 'marker', not {kind!r:.40}")
    version = record.get("v")
    if version != VERSION or isinstance(version, bool):
        raise IndexRecordError(f"field 'v' must be {VERSION}, not {version!r:.40}")
    if kind == KIND_MARKER:
        return Batch(kind, token=_text(record.get("id"), "id", limit=MAX_ID_BYTES, optional=False))
    items = record.get("n")
    if not isinstance(items, list) or not 0 < len(items) <= MAX_ENTRIES:
        raise IndexRecordError(f"field 'n' must be a list of 1 to {MAX_ENTRIES} entries")
    return Batch(kind, tuple(_decode_entry(found, i) for i, found in enumerate(items)))
