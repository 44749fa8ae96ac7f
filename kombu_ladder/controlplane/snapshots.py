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
one (both times per :data:`SIZE_UNIT` live cancellations, at most :data:`MAX_EVERY_MS`). So, while a relay
runs, a start reads at most ``EVERY_RECORDS * (1 + MAX_JITTER)`` records after the
snapshot it loads, plus those appended during the spacing after a burst and while a snapshot is being
written (a few ticks); and the first place it looks holds a complete snapshot (the time rule), so it reads
few snapshots. With no relay running, nothing is written, and the first start reads
back as far as a snapshot-less start does.

**Several relays.** Each keeps reading the snapshot stream after its start; a seal written by another relay
counts as its own (its count and time start again from it). The jitter (drawn once per relay) makes one
relay reach its threshold first, and the others see its seal before they reach theirs: two relays write
the same snapshot only when they reach their thresholds within the time one takes to write it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .codec import LiveEntry, Part, Seal
from .codec import encode as encode_record

__all__ = ["PART_ENTRIES", "EVERY_RECORDS", "EVERY_MS", "MIN_SPACING_MS", "SIZE_UNIT", "MAX_EVERY_MS", "MAX_JITTER",
           "WINDOWS_MS", "Snapshot",
           "encode", "Chooser", "Policy", "windows_ms"]

#: Live cancellations per part: a part of 500 entries of 36-character ids is about 40 KB.
PART_ENTRIES = 500
#: Cancellation records appended after the newest complete snapshot that make a relay write the next one.
EVERY_RECORDS = 5_000
#: The longest a relay goes without writing a snapshot (ms), records or none, per :data:`SIZE_UNIT` live
#: cancellations: a start's first look back (:data:`WINDOWS_MS`) then always holds one while a relay runs.
EVERY_MS = 60 * 1000
#: The shortest time between two snapshots (ms) per :data:`SIZE_UNIT` live cancellations: in a burst of
#: cancellations, one every 15 s at most (with 10,000 live or fewer).
MIN_SPACING_MS = 15 * 1000
#: Both times above grow with the live set, in steps of this many live cancellations (a snapshot of 10,000 is
#: about 800 KB), up to :data:`MAX_EVERY_MS`: what relays write stays under about 3 MB a minute.
SIZE_UNIT = 10_000
#: The longest a relay goes without writing a snapshot, however big: a start's second look back holds one.
MAX_EVERY_MS = 10 * 60 * 1000
#: Each relay's thresholds are the ones above times ``1 + random.uniform(0, MAX_JITTER)``.
MAX_JITTER = 0.25


def windows_ms(every_ms: int) -> tuple[int, int]:
    """How far back (ms) a start reads the snapshot stream, in turn until it finds a complete snapshot: past the
    longest time between two snapshots of a live set up to :data:`SIZE_UNIT` first (few are read), then past
    :data:`MAX_EVERY_MS`. Without one in either, the start reads the cancellations back."""
    return (int(min(every_ms, MAX_EVERY_MS) * (1 + MAX_JITTER)) + 45 * 1000,
            int(max(every_ms, MAX_EVERY_MS) * (1 + MAX_JITTER)) + 2 * 60 * 1000)


#: The windows of the default policy.
WINDOWS_MS = windows_ms(EVERY_MS)


@dataclass(frozen=True)
class Snapshot:
    """A complete snapshot: its seal and every live cancellation of its parts."""

    seal: Seal
    entries: tuple[LiveEntry, ...]


def encode(snapshot: str, entries: Iterable[LiveEntry], *, covers: int, at: int,
           part_entries: int = PART_ENTRIES) -> tuple[list[bytes], Seal]:
    """Return the parts (encoded: at least one, maybe empty) of a snapshot of ``entries``, and its seal.

    ``covers`` is the offset of the last cancellation record ``entries`` hold the effect of.
    """
    if part_entries < 1:
        raise ValueError(f"part_entries must be at least 1, not {part_entries}")
    chunk: list[LiveEntry] = []
    parts: list[bytes] = []
    for entry in entries:
        chunk.append(entry)
        if len(chunk) == part_entries:
            parts.append(encode_record(Part(snapshot, len(parts), tuple(chunk))))
            chunk = []
    if chunk or not parts:
        parts.append(encode_record(Part(snapshot, len(parts), tuple(chunk))))
    return parts, Seal(snapshot, len(parts), covers, at)


@dataclass
class _Pending:
    parts: dict[int, tuple[LiveEntry, ...]] = field(default_factory=dict)
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

    def due(self, *, records: Optional[int], since_ms: Optional[int], live: int = 0) -> bool:
        """Whether to write a snapshot now.

        Arguments:
            records: cancellation records appended after the newest complete snapshot known (None: none known).
            since_ms: ms since that snapshot was sealed, or since this relay's last attempt if later (None: never).
            live: the live cancellations the snapshot would hold (the times grow with it: :data:`SIZE_UNIT`).
        """
        factor = 1.0 + self.jitter
        size = max(1.0, live / SIZE_UNIT)
        every = min(self.every_ms * size, max(self.every_ms, MAX_EVERY_MS))
        if since_ms is not None and since_ms < min(self.min_spacing_ms * size, every):
            return False
        if records is None or since_ms is None:
            return True
        return records >= self.every_records * factor or since_ms >= every * factor

    def windows_ms(self) -> tuple[int, int]:
        """How far back a start reads the snapshot stream, in turn (see :data:`WINDOWS_MS`)."""
        return windows_ms(self.every_ms)

