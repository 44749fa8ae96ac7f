"""LiveSet: the ids of the live cancellations, in well under 100 bytes each (pure: no kombu, no I/O).

A relay keeps every cancellation written in the last day (see :data:`LIFE`): a million after a bulk
cancel. Kept as a dict of id strings to tuples that cost about 208 bytes each; here each is four
64-bit numbers in sorted arrays (the id's ``hash()``, where its UTF-8 bytes are, when its latest record
was written and when the latest expires) and the id itself, a length byte and its UTF-8 bytes appended
to one ``bytearray``. An id matches when its hash does and its bytes are equal, so the set answers
exactly, and gives its ids back for a snapshot (:meth:`LiveSet.entries`). The newest additions wait in
a small dict until there are enough of them to merge (an eighth of the set) or the set is pruned, so
adding stays cheap; a prune copies the bytes of the ids it keeps once those it forgot are the most.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable
from itertools import compress
from typing import TYPE_CHECKING, Any, Optional

from ..contract import RUNGS

if TYPE_CHECKING:  # records imports this module: its Record is read by attribute only
    from .records import Record

__all__ = ["LiveSet", "MARGIN", "SLACK", "LONGEST_RUNG", "LIFE"]

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
#: The fewest pending additions merged into the arrays at once (more when the set is large: an eighth of it).
MERGE_AT = 1024
#: The longest id kept (UTF-8 bytes): its length is one byte of :attr:`LiveSet._ids` (an AMQP shortstr's limit).
MAX_ID_BYTES = 255
#: The first key an id is sorted and found by (Python's ``hash()``: a str caches it, so a lookup mostly costs none).
_hash = hash



def _utf8(ident: str) -> bytes:
    """``ident`` as the set keeps it (an id of at most 255 bytes, as :func:`~.records.check_id` allows)."""
    return ident.encode("utf-8", "surrogatepass")


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
        #: The merged ids, sorted by ``hash()``: the hash, where the id is in :attr:`_ids`, the latest write,
        #: the latest expiry.
        self._hashes = array("q")
        self._offsets = array("q")
        self._at = array("q")
        self._until = array("q")
        #: The merged ids' UTF-8 bytes, each after a byte of its length, in the order they were merged (the
        #: forgotten ones stay until a prune copies the others).
        self._ids = bytearray()
        #: Bytes of :attr:`_ids` that belong to forgotten ids.
        self._garbage = 0
        #: Ids added since the last merge: id -> (the latest write, the latest expiry).
        self._pending: dict[str, tuple[int, int]] = {}
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
        self._keep(record.id, record.at, until)
        return True

    def cancelled(self, message_id: Any, now: int, *, entered: Optional[int] = None) -> bool:
        """Whether a message with this id is cancelled at ``now`` (epoch ms).

        ``entered`` is when the message entered the rung it just left (epoch ms),
        when known: a message that entered it later than the record was written
        (plus :data:`SLACK`) was scheduled after the cancellation, and is not
        cancelled by it. Unknown (None), the id alone decides.
        """
        found = self._get(message_id)
        if found is None or found[1] <= now:
            return False
        return entered is None or entered <= found[0] + self.slack_ms

    def prune(self, now: int, *, force: bool = False) -> int:
        """Forget the expired cancellations (at most once per ``prune_every_ms`` unless forced); return how many.

        The ids added since the last merge are merged then too, so that the set is at its most compact after a
        prune (a relay prunes, forced, once it has read the records it starts from).
        """
        if not force and now < self._next_prune:
            return 0
        self._next_prune = now + self.prune_every_ms
        expired = [key for key, (_, until) in self._pending.items() if until <= now]
        for key in expired:
            del self._pending[key]
        count = len(expired)
        if self._until and min(self._until) <= now:
            keep = [until > now for until in self._until]
            ids = self._ids
            self._garbage += sum(ids[offset] + 1 for offset in compress(self._offsets, [not k for k in keep]))
            count += len(keep) - sum(keep)
            for name in ("_hashes", "_offsets", "_at", "_until"):
                setattr(self, name, array("q", compress(getattr(self, name), keep)))
            if self._garbage * 2 > len(ids):
                self._compact()
        if self._pending:
            self._merge()
        return count

    def entries(self) -> list[tuple[str, int, int]]:
        """Every live cancellation as ``(id, written, until)`` (epoch ms): what a snapshot holds."""
        ids = self._ids
        merged = [(ids[offset + 1:offset + 1 + ids[offset]].decode("utf-8", "surrogatepass"), at, until)
                  for offset, at, until in zip(self._offsets, self._at, self._until)]
        return merged + [(key, at, until) for key, (at, until) in self._pending.items()]

    def restore(self, entries: Iterable[tuple[str, int, int]], now: int) -> int:
        """Keep the cancellations of a snapshot (see :meth:`entries`) that live past ``now``; return how many.

        An id already kept keeps the latest written and the latest expiry of the two, as :meth:`add` does.
        """
        kept = 0
        for key, at, until in entries:
            if until <= now:
                continue
            self._keep(key, at, until)
            kept += 1
        return kept

    def __len__(self) -> int:
        return len(self._hashes) + len(self._pending)

    def __contains__(self, message_id: object) -> bool:
        return self._get(message_id) is not None

    # -- the arrays --------------------------------------------------------------------------------------------

    def _keep(self, ident: str, at: int, until: int) -> None:
        """Keep ``ident`` written at ``at`` until ``until``, or its latest write and expiry if it is kept already."""
        slot = self._slot(ident)
        if slot >= 0:
            self._at[slot] = max(self._at[slot], at)
            self._until[slot] = max(self._until[slot], until)
            return
        if len(_utf8(ident)) > MAX_ID_BYTES:
            raise ValueError(f"a cancelled id must be at most {MAX_ID_BYTES} bytes in UTF-8, not {ident[:40]!r}...")
        old_at, old_until = self._pending.get(ident, (at, until))
        self._pending[ident] = (max(old_at, at), max(old_until, until))
        if len(self._pending) >= max(MERGE_AT, len(self._hashes) >> 3):
            self._merge()

    def _get(self, ident: object) -> Optional[tuple[int, int]]:
        """(the latest write, the latest expiry) of ``ident``'s records, or None."""
        if not isinstance(ident, str):
            return None
        found = self._pending.get(ident)
        if found is not None:
            return found
        slot = self._slot(ident)
        return None if slot < 0 else (self._at[slot], self._until[slot])

    def _slot(self, ident: str) -> int:
        """Where ``ident`` is in the merged arrays, or -1."""
        hashes = self._hashes
        if not hashes:
            return -1
        key = _hash(ident)
        slot = bisect_left(hashes, key)
        if slot == len(hashes) or hashes[slot] != key:
            return -1
        wanted = _utf8(ident)
        size = len(wanted)
        ids, offsets = self._ids, self._offsets
        while slot < len(hashes) and hashes[slot] == key:  # ids with one hash() (rare): their bytes tell
            offset = offsets[slot]
            if ids[offset] == size and ids[offset + 1:offset + 1 + size] == wanted:
                return slot
            slot += 1
        return -1

    def _merge(self) -> None:
        """Move the pending ids into the sorted arrays (one copy of each array, in C, between insertion points)."""
        ids = self._ids
        new = []
        for ident, (at, until) in self._pending.items():
            data = _utf8(ident)
            new.append((_hash(ident), len(ids), at, until))
            ids.append(len(data))
            ids += data
        new.sort()
        self._pending = {}
        old = (self._hashes, self._offsets, self._at, self._until)
        merged = tuple(array("q") for _ in old)
        start = 0
        for item in new:
            end = bisect_left(old[0], item[0], start)
            for column, source, value in zip(merged, old, item):
                column.extend(source[start:end])
                column.append(value)
            start = end
        for column, source in zip(merged, old):
            column.extend(source[start:])
        self._hashes, self._offsets, self._at, self._until = merged

    def _compact(self) -> None:
        """Copy the bytes of the kept ids into a new :attr:`_ids`, without those of the forgotten ones."""
        old, ids, offsets = self._ids, bytearray(), array("q")
        for offset in self._offsets:
            offsets.append(len(ids))
            ids += old[offset:offset + 1 + old[offset]]
        self._ids, self._offsets, self._garbage = ids, offsets, 0
