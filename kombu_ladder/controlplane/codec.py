"""The control plane's one codec: every record kind in one JSON envelope, decoded only from its exchange (pure).

Every record is a JSON object ``{"ladder": kind, "v": version, ...}``. :data:`FORMATS` is the table of
kinds: each with its versions, its size limit and its fields. :func:`encode` writes any record;
:func:`decode` reads one untrusted body as the broker delivered it from a stream, with the exchange the
broker reported, and raises a :class:`RecordError` whose :attr:`~RecordError.reason` says why it was
refused (readers count skips by kind and reason). The formats are free to change until the next release;
after it they are a contract like the wire's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Union

from .table import ADOPTED, CANCEL, ENTRY, MARKER, SEAL, SNAPSHOT, accepts

__all__ = [
    "VERSION", "MAX_ID_BYTES", "MAX_NAME_BYTES", "MAX_CANCEL_BYTES", "MAX_CANCEL_IDS", "MAX_INDEX_BYTES",
    "MAX_ENTRIES", "MAX_SMALL_BYTES", "MAX_BYTES", "KEYS", "REASONS",
    "RecordError", "UnknownRecord", "ForgedRecord",
    "Cancellation", "Cancel", "Entry", "Entries", "Adoption", "Marker", "Part", "Seal", "LiveEntry", "Record",
    "Format", "FORMATS", "MAX_PART_BYTES", "MAX_PART_ENTRIES", "MAX_PARTS",
    "encode", "decode", "kind_of", "load_object", "millis", "check_id", "pack_ids",
]

#: The version every kind is written with today (each kind's :class:`Format` lists those it reads).
VERSION = 1
#: The longest an AMQP ``message_id`` (or task id, or marker token) may be, in UTF-8 bytes (a shortstr).
MAX_ID_BYTES = 255
#: The longest a task name, exchange or routing key may be (AMQP shortstr), in UTF-8 bytes.
MAX_NAME_BYTES = 255
#: A cancellation record (one id or a batch of them) is at most this big. The writer packs ids until the next
#: would pass it (or :data:`MAX_CANCEL_IDS`): about 1,000 UUIDs, far below a stream chunk.
MAX_CANCEL_BYTES = 64 * 1024
#: The most ids one cancellation record holds.
MAX_CANCEL_IDS = 1000
#: An index record is at most this big (a full batch of :data:`MAX_ENTRIES` is about 200 KB).
MAX_INDEX_BYTES = 1 << 20
#: The most entries one index record holds.
MAX_ENTRIES = 1000
#: Adoption records and markers are at most this big.
MAX_SMALL_BYTES = 4096
#: A snapshot part is at most this big, and holds at most this many live cancellations (ids are at most 255
#: bytes, so a full part of the writer's 500 fits); a seal announces at most :data:`MAX_PARTS` parts.
MAX_PART_BYTES = 256 * 1024
MAX_PART_ENTRIES = 1000
MAX_PARTS = 100_000
#: No record of any kind is bigger: a body past it is refused before it is parsed.
MAX_BYTES = max(MAX_CANCEL_BYTES, MAX_INDEX_BYTES, MAX_SMALL_BYTES, MAX_PART_BYTES)
#: What a cancelled id is matched as (see :mod:`kombu_ladder.cancellation.records`).
KEYS = ("message_id", "task_id")
#: Why a record is refused: its :attr:`RecordError.reason`, the label of the skip counters.
REASONS = ("malformed", "size", "unknown", "exchange")
#: An id of at most this many characters is within ``MAX_ID_BYTES`` however it encodes (4 bytes a character).
_SHORT_ID = MAX_ID_BYTES // 4


class RecordError(ValueError):
    """A body read from a stream that is not a valid record (the reason is the message).

    :attr:`reason` is one of :data:`REASONS`, :attr:`kind` the ``ladder`` field when it was read.
    """

    reason = "malformed"

    def __init__(self, message: str, *, kind: Optional[str] = None) -> None:
        super().__init__(message)
        #: The record's kind, when it got that far (a str of ours; None before).
        self.kind = kind


class UnknownRecord(RecordError):
    """A record of a kind or version this release does not know: a newer writer's, skipped and counted."""

    reason = "unknown"


class ForgedRecord(RecordError):
    """A record that did not come through its kind's exchange: whoever wrote it had no right to, so it is skipped."""

    reason = "exchange"


class _TooBig(RecordError):
    reason = "size"


@dataclass(frozen=True)
class Cancellation:
    """One cancelled id, as a reader applies it: a :class:`Cancel` record holds one or many."""

    #: Always ``"cancel"`` (a field of its own so that readers of one id and of a marker compare alike).
    kind: str
    id: str
    #: When it was written (epoch ms).
    at: int
    #: The cancelled message's due time (epoch ms), when the canceller knew it.
    due: Optional[int] = None
    #: What ``id`` is: one of :data:`KEYS`.
    key: str = "message_id"


@dataclass(frozen=True)
class Cancel:
    """A cancellation record: one id (``"id"``) or a batch (``"ids"``), all written at ``at`` with one due time."""

    ids: tuple[str, ...]
    at: int
    due: Optional[int] = None
    key: str = "message_id"

    def each(self) -> tuple[Cancellation, ...]:
        """The cancellations it holds, one per id (a reader expands a batch with this)."""
        return tuple(Cancellation(CANCEL.name, i, self.at, self.due, self.key) for i in self.ids)


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
class Entries:
    """An index record: a batch of 1 to :data:`MAX_ENTRIES` entries."""

    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Adoption:
    """An adoption record: task ``id`` sent with ``eta`` was moved into the ladder, its copy due at ``due``."""

    id: str
    #: The task's ``eta`` header, as sent.
    eta: str
    #: The copy's due time (epoch ms).
    due: int


@dataclass(frozen=True)
class Marker:
    """A reader's catch-up marker: a reader that reads its own ``token`` back has read every earlier record."""

    token: str
    #: When it was written (epoch ms).
    at: int = 0


#: One live cancellation in a snapshot: its id, when its latest record was written, and until when it lives
#: (epoch ms), as :meth:`~kombu_ladder.cancellation.records.LiveSet.entries` gives them.
LiveEntry = tuple[str, int, int]


@dataclass(frozen=True)
class Part:
    """A part of a snapshot of the live cancellations (:mod:`~kombu_ladder.controlplane.snapshots`)."""

    snapshot: str
    index: int
    entries: tuple[LiveEntry, ...]


@dataclass(frozen=True)
class Seal:
    """A snapshot's seal: it has ``parts`` parts, and holds every cancellation up to offset ``covers``."""

    snapshot: str
    parts: int
    #: The offset in ``ladder.cancellations`` of the last record the snapshot holds the effect of.
    covers: int
    #: When it was sealed (epoch ms, the writer's clock).
    at: int


#: Any decoded record.
Record = Union[Cancel, Entries, Adoption, Marker, Part, Seal]


# -- untrusted fields -------------------------------------------------------------------------------

def load_object(body: Any, *, max_bytes: int, error: type[Exception] = RecordError) -> dict[str, Any]:
    """The JSON object a record's body holds (bytes; a str, as py-amqp decodes a body it has an encoding for).

    Raises:
        error: the body is too big, not UTF-8 JSON, or not a JSON object; the message says which.
    """
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise error(f"its body is a {type(body).__name__}, not bytes")
    if len(body) > max_bytes:
        raise (_TooBig if error is RecordError else error)(f"it is {len(body)} bytes, more than {max_bytes}")
    try:
        record = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise error(f"its body is not UTF-8 JSON: {type(exc).__name__}") from None
    if not isinstance(record, dict):
        raise error("its body is not a JSON object")
    return record


def millis(value: Any, field: str, *, error: type[Exception] = RecordError) -> int:
    """``value`` if it is epoch milliseconds (a non-negative integer below 2**53, not a bool).

    Raises:
        error: it is not, naming ``field``.
    """
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 53:
        raise error(f"field {field!r} must be epoch milliseconds (a non-negative integer), not {value!r:.40}")
    return value


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
    if len(message_id) > _SHORT_ID and len(message_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValueError(f"{argument} is longer than {MAX_ID_BYTES} bytes in UTF-8, which no AMQP message id can be")
    return message_id


def _record_id(value: Any, field: str) -> str:
    try:
        return check_id(value, argument=f"field {field!r}")
    except (TypeError, ValueError) as exc:
        raise RecordError(str(exc)) from None


def _text(value: Any, field: str, *, limit: int, optional: bool = True) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > limit:
        raise RecordError(f"field {field!r} must be a str of at most {limit} bytes, not {value!r:.40}")
    return value


def _dumps(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


# -- the kinds ---------------------------------------------------------------------------------------

def _write_cancel(record: Cancel) -> dict[str, Any]:
    if not record.ids or len(record.ids) > MAX_CANCEL_IDS:
        raise ValueError(f"a cancellation record holds 1 to {MAX_CANCEL_IDS} ids, not {len(record.ids)}")
    for message_id in record.ids:
        check_id(message_id)
    if record.key not in KEYS:
        raise ValueError(f"key must be one of {', '.join(KEYS)}, not {record.key!r}")
    found: dict[str, Any] = {"ladder": CANCEL.name, "v": VERSION}
    if len(record.ids) == 1:
        found["id"] = record.ids[0]
    else:
        found["ids"] = list(record.ids)
    found["at"] = millis(record.at, "at", error=ValueError)
    if record.key != "message_id":
        found["key"] = record.key
    if record.due is not None:
        found["due"] = millis(record.due, "due", error=ValueError)
    return found


def _read_cancel(found: dict[str, Any]) -> Cancel:
    if "ids" in found:
        ids = found["ids"]
        if not isinstance(ids, list) or not 0 < len(ids) <= MAX_CANCEL_IDS:
            raise RecordError(f"field 'ids' must be a list of 1 to {MAX_CANCEL_IDS} ids", kind=CANCEL.name)
        read = tuple(_record_id(value, f"ids[{i}]") for i, value in enumerate(ids))
    else:
        read = (_record_id(found.get("id"), "id"),)
    key = found.get("key", "message_id")
    if key not in KEYS:
        raise RecordError(f"field 'key' must be one of {', '.join(KEYS)}, not {key!r:.40}")
    due = found.get("due")
    return Cancel(read, millis(found.get("at"), "at"), None if due is None else millis(due, "due"), key)


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


def _write_entries(record: Entries) -> dict[str, Any]:
    if not record.entries or len(record.entries) > MAX_ENTRIES:
        raise ValueError(f"a batch holds 1 to {MAX_ENTRIES} entries, not {len(record.entries)}")
    return {"ladder": ENTRY.name, "v": VERSION, "n": [_entry_object(e) for e in record.entries]}


def _read_entry(found: Any, index: int) -> Entry:
    if not isinstance(found, dict):
        raise RecordError(f"entry {index} is not a JSON object")
    where = f"n[{index}]."
    size = found.get("s", 0)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 2 ** 53:
        raise RecordError(f"field {where + 's'!r} must be a byte count, not {size!r:.40}")
    return Entry(
        _text(found.get("m"), where + "m", limit=MAX_ID_BYTES),
        _text(found.get("c"), where + "c", limit=MAX_ID_BYTES),
        _text(found.get("t"), where + "t", limit=MAX_NAME_BYTES),
        _text(found.get("e"), where + "e", limit=MAX_NAME_BYTES, optional=False) or "",
        _text(found.get("r"), where + "r", limit=MAX_NAME_BYTES, optional=False) or "",
        millis(found.get("d"), where + "d"),
        millis(found.get("a"), where + "a"),
        size,
        None if found.get("w") is None else millis(found.get("w"), where + "w"),
    )


def _read_entries(found: dict[str, Any]) -> Entries:
    items = found.get("n")
    if not isinstance(items, list) or not 0 < len(items) <= MAX_ENTRIES:
        raise RecordError(f"field 'n' must be a list of 1 to {MAX_ENTRIES} entries")
    return Entries(tuple(_read_entry(item, i) for i, item in enumerate(items)))


def _short_text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 255:
        raise RecordError(f"field {field!r} must be a string of 1 to 255 characters, not {value!r:.40}")
    return value


def _write_adoption(record: Adoption) -> dict[str, Any]:
    try:
        return {"ladder": ADOPTED.name, "v": VERSION, "id": _short_text(record.id, "id"),
                "eta": _short_text(record.eta, "eta"), "due": millis(record.due, "due")}
    except RecordError as exc:
        raise ValueError(str(exc)) from None


def _read_adoption(found: dict[str, Any]) -> Adoption:
    return Adoption(_short_text(found.get("id"), "id"), _short_text(found.get("eta"), "eta"),
                    millis(found.get("due"), "due"))


def _write_marker(record: Marker) -> dict[str, Any]:
    check_id(record.token, argument="token")
    return {"ladder": MARKER.name, "v": VERSION, "id": record.token, "at": millis(record.at, "at", error=ValueError)}


def _read_marker(found: dict[str, Any]) -> Marker:
    return Marker(_record_id(found.get("id"), "id"), millis(found.get("at", 0), "at"))


def _count(value: Any, field: str, *, low: int = 0, high: int = 2 ** 53) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise RecordError(f"field {field!r} must be an integer from {low} to {high - 1}, not {value!r:.40}")
    return value


def _write_part(record: Part) -> dict[str, Any]:
    if len(record.entries) > MAX_PART_ENTRIES:
        raise ValueError(f"a snapshot part holds at most {MAX_PART_ENTRIES} entries, not {len(record.entries)}")
    return {"ladder": SNAPSHOT.name, "v": VERSION, "id": record.snapshot, "part": record.index,
            "entries": [[key, at, until] for key, at, until in record.entries]}


def _read_live(item: Any, index: int) -> LiveEntry:
    if not isinstance(item, list) or len(item) != 3:
        raise RecordError(f"entry {index} must be [id, at, until], not {item!r:.60}")
    return (_record_id(item[0], f"entries[{index}][0]"), millis(item[1], f"entries[{index}][1]"),
            millis(item[2], f"entries[{index}][2]"))


def _read_part(found: dict[str, Any]) -> Part:
    items = found.get("entries")
    if not isinstance(items, list) or len(items) > MAX_PART_ENTRIES:
        raise RecordError(f"field 'entries' must be a list of at most {MAX_PART_ENTRIES} [id, at, until]")
    return Part(_short_text(found.get("id"), "id"), _count(found.get("part"), "part", high=MAX_PARTS),
                tuple(_read_live(item, i) for i, item in enumerate(items)))


def _write_seal(record: Seal) -> dict[str, Any]:
    return {"ladder": SEAL.name, "v": VERSION, "id": record.snapshot, "parts": record.parts,
            "covers": record.covers, "at": millis(record.at, "at", error=ValueError)}


def _read_seal(found: dict[str, Any]) -> Seal:
    return Seal(_short_text(found.get("id"), "id"), _count(found.get("parts"), "parts", low=1, high=MAX_PARTS + 1),
                _count(found.get("covers"), "covers"), millis(found.get("at"), "at"))


@dataclass(frozen=True)
class Format:
    """One record kind's format: the versions read, the size limit, and how its fields are written and read."""

    #: The ``ladder`` field (a kind of :mod:`~kombu_ladder.controlplane.table`, with its exchange).
    kind: str
    #: The record class.
    type: type
    #: The versions :func:`decode` reads (a later one is :class:`UnknownRecord`).
    versions: frozenset[int]
    #: The largest body of this kind, in bytes.
    max_bytes: int
    write: Callable[[Any], dict[str, Any]]
    read: Callable[[dict[str, Any]], Any]


#: Every kind this release reads and writes, by its ``ladder`` field.
FORMATS: dict[str, Format] = {f.kind: f for f in (
    Format(CANCEL.name, Cancel, frozenset({VERSION}), MAX_CANCEL_BYTES, _write_cancel, _read_cancel),
    Format(ENTRY.name, Entries, frozenset({VERSION}), MAX_INDEX_BYTES, _write_entries, _read_entries),
    Format(ADOPTED.name, Adoption, frozenset({VERSION}), MAX_SMALL_BYTES, _write_adoption, _read_adoption),
    Format(MARKER.name, Marker, frozenset({VERSION}), MAX_SMALL_BYTES, _write_marker, _read_marker),
    Format(SNAPSHOT.name, Part, frozenset({VERSION}), MAX_PART_BYTES, _write_part, _read_part),
    Format(SEAL.name, Seal, frozenset({VERSION}), MAX_SMALL_BYTES, _write_seal, _read_seal),
)}
_BY_TYPE = {f.type: f for f in FORMATS.values()}


def kind_of(record: Record) -> str:
    """The ``ladder`` field of ``record``.

    Raises:
        TypeError: it is no control-plane record.
    """
    found = _BY_TYPE.get(type(record))
    if found is None:
        raise TypeError(f"not a control-plane record: {type(record).__name__}")
    return found.kind


def encode(record: Record) -> bytes:
    """The body (compact UTF-8 JSON) of ``record``.

    Raises:
        TypeError, ValueError: a field it cannot hold (an id that is no AMQP message id, too many ids or
            entries, a negative time); the message names it.
    """
    found = _BY_TYPE.get(type(record))
    if found is None:
        raise TypeError(f"not a control-plane record: {type(record).__name__}")
    body = _dumps(found.write(record))
    if len(body) > found.max_bytes:
        raise ValueError(f"a {found.kind!r} record of {len(body)} bytes is more than its {found.max_bytes}")
    return body


def decode(body: Any, exchange: Any) -> Record:
    """Read one untrusted record, delivered from a stream through ``exchange`` (as the broker reported it).

    Raises:
        RecordError: not a valid record; :attr:`~RecordError.reason` says why (:data:`REASONS`):
            :class:`ForgedRecord` when it did not come through its kind's exchange, :class:`UnknownRecord`
            for a kind or version this release does not read.
    """
    found = load_object(body, max_bytes=MAX_BYTES)
    kind = found.get("ladder")
    spec = FORMATS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise UnknownRecord(f"field 'ladder' is not a kind of record this release reads: {kind!r:.40}")
    if not accepts(spec.kind, exchange):
        raise ForgedRecord(f"a {spec.kind!r} record written through the exchange {exchange!r:.60}, not its own",
                           kind=spec.kind)
    size = len(body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body)
    if size > spec.max_bytes:
        raise _TooBig(f"it is {size} bytes, more than {spec.max_bytes}", kind=spec.kind)
    version = found.get("v")
    if isinstance(version, bool) or version not in spec.versions:
        raise UnknownRecord(f"field 'v' is not a version of {spec.kind!r} this release reads: {version!r:.40}",
                            kind=spec.kind)
    try:
        return spec.read(found)  # type: ignore[no-any-return]
    except RecordError as exc:
        exc.kind = spec.kind
        raise


def pack_ids(ids: list[str], *, at: int, due: Optional[int] = None, key: str = "message_id") -> list[Cancel]:
    """``ids`` in as few :class:`Cancel` records as fit: each of at most :data:`MAX_CANCEL_IDS` ids and
    :data:`MAX_CANCEL_BYTES` bytes encoded (ids are measured as JSON writes them)."""
    records: list[Cancel] = []
    batch: list[str] = []
    room = MAX_CANCEL_BYTES - 200  # the envelope's other fields
    used = 0
    for message_id in ids:
        size = len(json.dumps(message_id, ensure_ascii=False).encode("utf-8", "surrogatepass")) + 1
        if batch and (len(batch) >= MAX_CANCEL_IDS or used + size > room):
            records.append(Cancel(tuple(batch), at, due, key))
            batch, used = [], 0
        batch.append(message_id)
        used += size
    if batch:
        records.append(Cancel(tuple(batch), at, due, key))
    return records
