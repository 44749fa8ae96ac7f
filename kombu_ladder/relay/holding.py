"""Held deliveries: messages the relay keeps unacked until their due time, earliest first (no I/O)."""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Optional

__all__ = ["Held"]


class Held:
    """Deliveries waiting for their due time (epoch ms), at most ``capacity`` of them.

    Each entry is the relay's :class:`~kombu_ladder.relay.pending.Publish` of a
    delivery; its message stays unacked until that publish is sent at the due
    time and confirmed. A crash or a lost channel gives every held message back
    to the broker, which redelivers it: holding never loses one.
    """

    def __init__(self, capacity: int) -> None:
        #: How many messages may be held at once; 0 turns holding off.
        self.capacity = capacity
        self._heap: list[tuple[int, int, Any]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def room(self) -> bool:
        """Whether one more message may be held."""
        return len(self._heap) < self.capacity

    def add(self, due_ms: int, publish: Any) -> bool:
        """Hold ``publish`` until ``due_ms``; return whether it is now the earliest held."""
        heapq.heappush(self._heap, (due_ms, next(self._order), publish))
        return self._heap[0][2] is publish

    def next_due(self) -> Optional[int]:
        """The earliest due time held (epoch ms), or None."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[Any]:
        """Remove and return the publishes due at ``now_ms`` or before, earliest first."""
        heap, out = self._heap, []
        while heap and heap[0][0] <= now_ms:
            out.append(heapq.heappop(heap)[2])
        return out

    def clear(self) -> list[Any]:
        """Remove and return everything held, earliest first."""
        out = [entry[2] for entry in sorted(self._heap)]
        self._heap = []
        return out
