"""Bookkeeping of unconfirmed republishes: which expired message each settles, and when (no I/O)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Optional

__all__ = ["Entry", "Pending"]


@dataclass
class Entry:
    """One publish the broker has not confirmed yet, by confirm sequence number."""

    #: The consumed message it settles; None for a replacement (see ``parent``).
    source: Any
    #: "deliver", "hop" or "park".
    kind: str
    exchange: str = ""
    routing_key: str = ""
    body: Any = None
    confirmed: bool = False
    #: The broker returned it (unroutable); a replacement publish settles its source.
    returned: bool = False
    #: The broker refused it (nack); a replacement publish settles its source.
    refused: bool = False
    #: Its source was already rejected back to the control queue.
    settled: bool = False
    #: Seq of the publish that replaces this one (a park after a return, a retry after a nack).
    waiting_on: Optional[int] = None
    #: For a replacement: the seq of the publish it replaces.
    parent: Optional[int] = None
    #: For a parking: why (its ``x-ladder-parked-reason``).
    reason: str = ""


def _as_bytes(body: Any) -> Any:
    return body.encode("utf-8") if isinstance(body, str) else body


class Pending:
    """Unconfirmed publishes in publish order, released to acks strictly in that order.

    Every expired message is consumed, then published once, in consumption
    order; so a prefix of confirmed entries is a prefix of delivery tags, and one
    ``basic_ack(multiple=True)`` settles all their sources.
    """

    def __init__(self) -> None:
        self._entries: "OrderedDict[int, Entry]" = OrderedDict()
        self._seq = 0

    def reset(self) -> None:
        """Forget everything: a new channel numbers its confirms from 1 again."""
        self._entries.clear()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple[int, Entry]]:
        return iter(list(self._entries.items()))

    @property
    def next_seq(self) -> int:
        """The sequence number the next publish will get."""
        return self._seq + 1

    def add(self, entry: Entry) -> int:
        """Record ``entry`` as the next publish; return its sequence number."""
        self._seq += 1
        self._entries[self._seq] = entry
        return self._seq

    def get(self, seq: Optional[int]) -> Optional[Entry]:
        """Return the entry for ``seq``, or None once released (or for None)."""
        return None if seq is None else self._entries.get(seq)

    def seqs(self, delivery_tag: int, multiple: bool) -> list[int]:
        """The unconfirmed sequence numbers a broker ack or nack with this tag covers.

        An entry already confirmed but not yet released (it waits for its
        replacement) is not covered again: a later ``multiple`` nack is not about it.
        """
        if multiple:
            return [seq for seq, entry in self._entries.items() if seq <= delivery_tag and not entry.confirmed]
        entry = self._entries.get(delivery_tag)
        return [delivery_tag] if entry is not None and not entry.confirmed else []

    def confirm(self, delivery_tag: int, multiple: bool) -> None:
        """Mark the publishes a broker ack covers as confirmed."""
        for seq in self.seqs(delivery_tag, multiple):
            self._entries[seq].confirmed = True

    def match_return(self, exchange: str, routing_key: str, body: Any) -> Optional[tuple[int, Entry]]:
        """Find the unconfirmed delivery or hop a ``basic.return`` is about (oldest first)."""
        body = _as_bytes(body)
        for seq, entry in self._entries.items():
            if (entry.kind in ("deliver", "hop") and not entry.returned and not entry.confirmed
                    and entry.exchange == exchange and entry.routing_key == routing_key
                    and _as_bytes(entry.body) == body):
                return seq, entry
        return None

    def release(self) -> tuple[list[Entry], Any]:
        """Pop, in order, every entry that is confirmed with its replacement confirmed too.

        Returns:
            The released entries that were not settled otherwise (to be counted),
            and the last source among them (to be acked with ``multiple=True``),
            or None when there is nothing to ack.
        """
        released: list[Entry] = []
        last = None
        entries = self._entries
        while entries:
            entry = next(iter(entries.values()))
            if not entry.confirmed:
                break
            if not self._replacements_confirmed(entry):
                break
            entries.popitem(last=False)
            if entry.settled:
                continue
            released.append(entry)
            if entry.source is not None:
                last = entry.source
        return released, last

    def _replacements_confirmed(self, entry: Entry) -> bool:
        """Whether every publish that replaces ``entry`` (a chain, in the worst case) is confirmed."""
        seq = entry.waiting_on
        while seq is not None:
            replacement = self.get(seq)
            if replacement is None:  # released already, so confirmed
                return True
            if not replacement.confirmed:
                return False
            seq = replacement.waiting_on
        return True
