"""LiveSet: the ids of the live cancellations, in about 40 bytes each (pure: no kombu, no I/O).

A relay keeps every cancellation written in the last day (see :data:`LIFE`): a million after a bulk
cancel. Kept as a dict of id strings to tuples that cost about 208 bytes each; here each is four
64-bit numbers in sorted arrays: the id's ``hash()``, a second 64-bit digest of it (BLAKE2b), when
its latest record was written and when the latest expires. An id matches when both its hash and
its digest do: two distinct ids share both with a probability of about 2\\ :sup:`-128` per pair,
far below any hardware's error rate. The newest additions wait in a small dict until there are
enough of them to merge (an eighth of the set) or the set is pruned, so adding stays cheap.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from hashlib import blake2b
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
#: The first key an id is sorted and found by (Python's ``hash()``: a str caches it, so a lookup mostly costs none).
_hash = hash


def _digest(ident: str) -> int:
    """A second 64-bit digest of ``ident``, independent of ``hash()`` (signed, to fit an ``array('q')``)."""
    return int.from_bytes(blake2b(ident.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little",
                          signed=True)


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
        #: The merged ids, sorted by ``hash()``: the hash, the digest, the latest write, the latest expiry.
        self._hashes = array("q")
        self._digests = array("q")
        self._at = array("q")
        self._until = array("q")
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
        ident = record.id
        slot = self._slot(ident)
        if slot >= 0:
            self._at[slot] = max(self._at[slot], record.at)
            self._until[slot] = max(self._until[slot], until)
            return True
        at, old_until = self._pending.get(ident, (record.at, until))
        self._pending[ident] = (max(at, record.at), max(old_until, until))
        if len(self._pending) >= max(MERGE_AT, len(self._hashes) >> 3):
            self._merge()
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
            count += len(keep) - sum(keep)
            for name in ("_hashes", "_digests", "_at", "_until"):
                setattr(self, name, array("q", compress(getattr(self, name), keep)))
        if self._pending:
            self._merge()
        return count

    def __len__(self) -> int:
        return len(self._hashes) + len(self._pending)

    def __contains__(self, message_id: object) -> bool:
        return self._get(message_id) is not None

    # -- the arrays --------------------------------------------------------------------------------------------

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
        digest = _digest(ident)
        while slot < len(hashes) and hashes[slot] == key:  # ids with one hash() (rare): the digest tells
            if self._digests[slot] == digest:
                return slot
            slot += 1
        return -1

    def _merge(self) -> None:
        """Move the pending ids into the sorted arrays (one copy of each array, in C, between insertion points)."""
        new = sorted((_hash(ident), _digest(ident), at, until) for ident, (at, until) in self._pending.items())
        self._pending = {}
        old = (self._hashes, self._digests, self._at, self._until)
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
        self._hashes, self._digests, self._at, self._until = merged
