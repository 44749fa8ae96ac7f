"""Snapshots of the live cancellations: parts, a seal, the newest complete one, and when to write one (pure).

A relay that starts loads the newest complete snapshot (from ``ladder.snapshots``) into its
:class:`~kombu_ladder.cancellation.records.LiveSet`, then reads ``ladder.cancellations`` only from the offset
after the one the snapshot covers. A snapshot is written as parts (each a record with the snapshot's id, its
index and up to :data:`PART_ENTRIES` live cancellations), then sealed (a record with its id, its part count,
the cancellation offset it covers up to and when it was sealed). A snapshot whose seal is missing, or whose
parts do not match the seal's count, is ignored: a relay killed while writing one leaves the previous one
the newest complete.

**The start bound.** Relays write a snapshot once :data:`EVERY_RECORDS` cancellation records (times the
relay's jitter, at most ``1 + MAX_JITTER``) were appended after the newest complete snapshot they know, and
at least every :data:`EVERY_MS` (times the jitter), but never within :data:`MIN_SPACING_MS` of the previous
one. So, while a relay runs, a start reads at most ``EVERY_RECORDS * (1 + MAX_JITTER)`` records after the
snapshot it loads, plus those appended during the :data:`MIN_SPACING_MS` after a burst and while a snapshot
is being written (a few ticks). With no relay running, nothing is written, and the first start reads
back as far as a snapshot-less start does.

**Several relays.** Each keeps reading the snapshot stream after its start; a seal written by another relay
counts as its own (its count and time start again from it). The jitter (drawn once per relay) makes one
relay reach its threshold first, and the others see its seal before they reach theirs: two relays write
the same snapshot only when they reach their thresholds within the time one takes to write it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .controlplane import SEAL, SNAPSHOT
from .jsonrecords import load_object, millis

__all__ = ["PART_ENTRIES", "MAX_PART_BYTES", "MAX_PARTS", "EVERY_RECORDS", "EVERY_MS", "MIN_SPACING_MS",
           "MAX_JITTER", "WINDOWS_MS", "Entry", "Part", "Seal", "Snapshot", "SnapshotError", "encode_part",
           "encode_seal", "encode", "decode", "Chooser", "Policy", "windows_ms"]

#: Live cancellations per part: a part of 500 entries of 36-character ids is about 40 KB.
PART_ENTRIES = 500
#: A part (or seal) bigger than this is not one of ours: ids are at most 255 bytes, so 500 of them fit.
MAX_PART_BYTES = 256 * 1024
#: The most parts a seal may announce (fifty million live cancellations): more is not one of ours.
MAX_PARTS = 100_000
#: Cancellation records appended after the newest complete snapshot that make a relay write the next one.
EVERY_RECORDS = 10_000
#: The longest a relay goes without writing a snapshot (epoch ms), records or none: the snapshot stream keeps
#: six hours, and a start looks back :data:`WINDOWS_MS`.
EVERY_MS = 10 * 60 * 1000
#: The shortest time between two snapshots (ms): in a burst of cancellations, one every 15 s at most.
MIN_SPACING_MS = 15 * 1000
#: Each relay's thresholds are the ones above times ``1 + random.uniform(0, MAX_JITTER)``.
MAX_JITTER = 0.25
#: How far back (ms) a start reads the snapshot stream, in turn until it finds a complete snapshot: a short
#: window first (during a burst, snapshots come every :data:`MIN_SPACING_MS`, so few are read), then one past
#: the longest time between two snapshots. Without one in either, the start reads the cancellations back.
WINDOWS_MS = (4 * MIN_SPACING_MS, int(EVERY_MS * (1 + MAX_JITTER)) + 2 * 60 * 1000)  # windows_ms() of these
#: The record format's version.
VERSION = 1

#: One live cancellation: its id, when its latest record was written, and until when it lives (epoch ms).
Entry = tuple[str, int, int]


class SnapshotError(ValueError):
    """A record in the snapshot stream that is not a valid part or seal (the reason is the message)."""


@dataclass(frozen=True)
class Part:
    """One part of a snapshot: up to :data:`PART_ENTRIES` live cancellations."""

    snapshot: str
    index: int
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Seal:
    """A snapshot's seal: it has ``parts`` parts, and holds every cancellation up to offset ``covers``."""

    snapshot: str
    parts: int
    #: The offset in ``ladder.cancellations`` of the last record the snapshot holds the effect of.
    covers: int
    #: When it was sealed (epoch ms, the writer's clock).
    at: int


@dataclass(frozen=True)
class Snapshot:
    """A complete snapshot: its seal and every live cancellation of its parts."""

    seal: Seal
    entries: tuple[Entry, ...]


def _text(value: Any, name: str, *, most: int = 255) -> str:
    if not isinstance(value, str) or not value or len(value.encode("utf-8", "surrogatepass")) > most:
        raise SnapshotError(f"field {name!r} must be a non-empty str of at most {most} bytes, not {value!r:.40}")
    return value


def _count(value: Any, name: str, *, low: int = 0, high: int = 2 ** 53) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise SnapshotError(f"field {name!r} must be an integer from {low} to {high - 1}, not {value!r:.40}")
    return value


def _ms(value: Any, name: str) -> int:
    return millis(value, name, error=SnapshotError)


def _dumps(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode("utf-8")


def encode_part(snapshot: str, index: int, entries: Iterable[Entry]) -> bytes:
    """Return the part ``index`` of ``snapshot`` holding ``entries`` (JSON bytes)."""
    return _dumps({"ladder": SNAPSHOT.name, "v": VERSION, "id": snapshot, "part": index,
                   "entries": [[key, at, until] for key, at, until in entries]})


def encode_seal(seal: Seal) -> bytes:
    """Return the record sealing a snapshot (JSON bytes)."""
    return _dumps({"ladder": SEAL.name, "v": VERSION, "id": seal.snapshot, "parts": seal.parts,
                   "covers": seal.covers, "at": seal.at})


def encode(snapshot: str, entries: Iterable[Entry], *, covers: int, at: int,
           part_entries: int = PART_ENTRIES) -> tuple[list[bytes], bytes]:
    """Return the parts of a snapshot of ``entries`` (at least one, maybe empty) and its seal.

    ``covers`` is the offset of the last cancellation record ``entries`` hold the effect of.
    """
    if part_entries < 1:
        raise ValueError(f"part_entries must be at least 1, not {part_entries}")
    chunk: list[Entry] = []
    parts: list[bytes] = []
    for entry in entries:
        chunk.append(entry)
        if len(chunk) == part_entries:
            parts.append(encode_part(snapshot, len(parts), chunk))
            chunk = []
    if chunk or not parts:
        parts.append(encode_part(snapshot, len(parts), chunk))
    return parts, encode_seal(Seal(snapshot, len(parts), covers, at))


def _entries(value: Any) -> tuple[Entry, ...]:
    if not isinstance(value, list) or len(value) > PART_ENTRIES * 20:
        raise SnapshotError("field 'entries' must be a list of [id, at, until]")
    out = []
    for item in value:
        if not isinstance(item, list) or len(item) != 3:
            raise SnapshotError(f"an entry must be [id, at, until], not {item!r:.60}")
        out.append((_text(item[0], "entries.id"), _ms(item[1], "entries.at"), _ms(item[2], "entries.until")))
    return tuple(out)


def decode(body: Any) -> Union[Part, Seal]:
    """Read one untrusted part or seal of the snapshot stream (a reader's marker is read as a marker).

    Raises:
        SnapshotError: it is not a valid part or seal; the reason says which.
    """
    if isinstance(body, str):
        raise SnapshotError("its body is a str, not bytes")
    record = load_object(body, max_bytes=MAX_PART_BYTES, error=SnapshotError)
    kind = record.get("ladder")
    if kind not in (SNAPSHOT.name, SEAL.name):
        raise SnapshotError(f"field 'ladder' must be {SNAPSHOT.name!r} or {SEAL.name!r}, not {kind!r:.40}")
    if record.get("v") != VERSION or isinstance(record.get("v"), bool):
        raise SnapshotError(f"field 'v' must be {VERSION}, not {record.get('v')!r:.40}")
    snapshot = _text(record.get("id"), "id", most=64)
    if kind == SNAPSHOT.name:
        return Part(snapshot, _count(record.get("part"), "part", high=MAX_PARTS), _entries(record.get("entries")))
    return Seal(snapshot, _count(record.get("parts"), "parts", low=1, high=MAX_PARTS + 1),
                _count(record.get("covers"), "covers"), _ms(record.get("at"), "at"))


@dataclass
class _Pending:
    parts: dict[int, tuple[Entry, ...]] = field(default_factory=dict)
    seal: Optional[Seal] = None


class Chooser:
    """Collects the parts and seals read from the snapshot stream; :attr:`newest` is the newest complete snapshot.

    "Newest" is the one covering the highest cancellation offset (ties: the latest sealed). A part that
    comes twice keeps its first copy. At most ``keep`` snapshots are collected unsealed at a time (a relay
    killed while writing leaves parts without a seal): the oldest is forgotten first.
    """

    def __init__(self, *, keep: int = 8) -> None:
        self.keep = keep
        #: The newest complete snapshot read so far (None: none yet).
        self.newest: Optional[Snapshot] = None
        #: Seals read whose snapshot was incomplete (a part missing, or more parts than it says).
        self.incomplete = 0
        self._pending: dict[str, _Pending] = {}

    def add(self, record: Union[Part, Seal]) -> Optional[Snapshot]:
        """Take one record in stream order; return the snapshot it completes, if it completes a newer one."""
        pending = self._pending.get(record.snapshot)
        if pending is None:
            if isinstance(record, Part) and self._covered(record):
                return None
            pending = self._pending[record.snapshot] = _Pending()
            while len(self._pending) > self.keep:
                del self._pending[next(iter(self._pending))]
        if isinstance(record, Part):
            pending.parts.setdefault(record.index, record.entries)
        elif pending.seal is None:
            pending.seal = record
        return self._complete(record.snapshot, pending)

    def _covered(self, part: Part) -> bool:
        """Whether ``part`` belongs to a snapshot already chosen (a copy read again)."""
        return self.newest is not None and part.snapshot == self.newest.seal.snapshot

    def _complete(self, snapshot: str, pending: _Pending) -> Optional[Snapshot]:
        seal = pending.seal
        if seal is None:
            return None
        del self._pending[snapshot]
        if len(pending.parts) != seal.parts or any(index not in pending.parts for index in range(seal.parts)):
            self.incomplete += 1
            return None
        newest = self.newest
        if newest is not None and (newest.seal.covers, newest.seal.at) >= (seal.covers, seal.at):
            return None
        entries = tuple(entry for index in range(seal.parts) for entry in pending.parts[index])
        self.newest = Snapshot(seal, entries)
        return self.newest

    def forget(self) -> None:
        """Forget every part collected (the stream is read again from elsewhere); keep :attr:`newest`."""
        self._pending.clear()


class Policy:
    """When a relay writes a snapshot: by count of cancellation records and by time, with a per-relay jitter."""

    def __init__(self, *, every_records: int = EVERY_RECORDS, every_ms: int = EVERY_MS,
                 min_spacing_ms: int = MIN_SPACING_MS, part_entries: int = PART_ENTRIES,
                 jitter: Optional[float] = None, rng: Optional[random.Random] = None) -> None:
        for name, value, low in (("every_records", every_records, 1), ("every_ms", every_ms, 1),
                                 ("min_spacing_ms", min_spacing_ms, 0), ("part_entries", part_entries, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer of at least {low}, not {value!r}")
        if jitter is None:
            jitter = (rng or random.Random()).uniform(0.0, MAX_JITTER)
        if not 0.0 <= jitter <= MAX_JITTER:
            raise ValueError(f"jitter must be from 0 to {MAX_JITTER}, not {jitter!r}")
        self.every_records = every_records
        self.every_ms = every_ms
        self.min_spacing_ms = min_spacing_ms
        self.part_entries = part_entries
        self.jitter = jitter

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "Policy":
        """The policy, with any of ``LADDER_SNAPSHOT_RECORDS``, ``LADDER_SNAPSHOT_SECONDS``,
        ``LADDER_SNAPSHOT_SPACING_SECONDS`` and ``LADDER_SNAPSHOT_PART_ENTRIES`` (integers) set in ``environ``.

        Raises:
            ValueError: a variable that is not an integer in range, naming it.
        """
        given: dict[str, Any] = {}
        for variable, name, scale in (("LADDER_SNAPSHOT_RECORDS", "every_records", 1),
                                      ("LADDER_SNAPSHOT_SECONDS", "every_ms", 1000),
                                      ("LADDER_SNAPSHOT_SPACING_SECONDS", "min_spacing_ms", 1000),
                                      ("LADDER_SNAPSHOT_PART_ENTRIES", "part_entries", 1)):
            text = environ.get(variable)
            if text is None:
                continue
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"{variable} must be an integer, not {text!r:.40}") from None
            if not 0 <= value <= 10 ** 9:
                raise ValueError(f"{variable} must be from 0 to 1000000000, not {value}")
            given[name] = value * scale
        try:
            return cls(**given)
        except ValueError as exc:
            raise ValueError(f"the LADDER_SNAPSHOT_* variables: {exc}") from None

    def due(self, *, records: Optional[int], since_ms: Optional[int]) -> bool:
        """Whether to write a snapshot now.

        Arguments:
            records: cancellation records appended after the newest complete snapshot known (None: none known).
            since_ms: ms since that snapshot was sealed, or since this relay's last attempt if later (None: never).
        """
        factor = 1.0 + self.jitter
        if since_ms is not None and since_ms < self.min_spacing_ms:
            return False
        if records is None or since_ms is None:
            return True
        return records >= self.every_records * factor or since_ms >= self.every_ms * factor

    def windows_ms(self) -> tuple[int, int]:
        """How far back a start reads the snapshot stream, in turn (see :data:`WINDOWS_MS`)."""
        return windows_ms(self.min_spacing_ms, self.every_ms)


def windows_ms(min_spacing_ms: int, every_ms: int) -> tuple[int, int]:
    """How far back a start reads the snapshot stream, in turn: four spacings (during a burst, where a
    snapshot comes every spacing, so few are read), then past the longest time between two snapshots."""
    return (4 * max(min_spacing_ms, 1000), int(every_ms * (1 + MAX_JITTER)) + 2 * 60 * 1000)
