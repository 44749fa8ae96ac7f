"""The Holder: deliveries a relay keeps unacked until their due time, and the one wakeup that fires them (no I/O)."""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Optional

from ..link import Schedule
from ..plan import HOLD_BYTES

__all__ = ["Alarm", "Holder", "GUESS_BYTES", "FLOOR_BYTES", "MIN_ROOM"]

#: The size a relay assumes of a message before it has seen one (1 MiB): its first window is small enough
#: that a burst of big messages at start does not overrun the byte budget.
GUESS_BYTES = 1 << 20
#: The least size a message is reckoned at when sizing the window (32 KiB: 2,000 of them fill 64 MiB).
FLOOR_BYTES = 32 << 10
#: The least room for held messages a relay's window keeps (beyond the budget's bytes, nothing is held).
MIN_ROOM = 64


class Alarm:
    """A relay's ``wakeup(seconds)`` on a driver's timer, keeping at most one of its entries pending.

    The relay asks for a wakeup each time a message becomes the earliest held,
    and again after each :meth:`~kombu_ladder.relay.RelayCore.fire`. Passed
    straight to a timer, every such request stays an entry, and each entry
    schedules another when it fires: the entries multiply with the messages held.
    In a Celery worker they share the hub's timer with the tasks' ETAs, and the
    hub fires at most ten entries per loop before it waits for I/O (up to 1 s),
    so a pile of stale entries made tasks start seconds late.

    Here a request for a time no earlier than the pending entry's is dropped;
    an earlier one replaces it (the later entry is cancelled when the timer
    allows, and is ignored when it fires).

    ``schedule(seconds, callback)`` sets one timer entry and returns it (an
    object with ``cancel()``, or anything); ``clock`` is the relay's clock.
    """

    def __init__(self, schedule: Schedule, fire: Callable[[], None],
                 clock: Callable[[], float]) -> None:
        self._schedule = schedule
        self._fire = fire
        self._clock = clock
        self._at: Optional[float] = None  #: when the pending entry is due (clock seconds), None if none
        self._entry: Any = None
        self._generation = 0

    @property
    def pending(self) -> Optional[float]:
        """When the pending entry is due (clock seconds), or None."""
        return self._at

    def __call__(self, seconds: float) -> None:
        at = self._clock() + seconds
        if self._at is not None and self._at <= at:
            return  # the pending entry fires first, and the relay asks again then
        self.cancel()
        self._at, self._generation = at, self._generation + 1
        generation = self._generation
        self._entry = self._schedule(seconds, lambda: self._ring(generation))

    def _ring(self, generation: int) -> None:
        if generation != self._generation:
            return  # replaced by an earlier entry, which fired already
        self._at = self._entry = None
        self._fire()

    def cancel(self) -> None:
        """Cancel the pending entry, if any (the relay is stopping, or an earlier one replaces it)."""
        entry, self._entry, self._at = self._entry, None, None
        self._generation += 1
        cancel = getattr(entry, "cancel", None)
        if callable(cancel):
            cancel()


class Holder:
    """Deliveries waiting for their due time (epoch ms), earliest first: at most ``capacity`` of them
    and ``budget`` bytes (bodies and properties).

    * The decision is pure (:func:`kombu_ladder.envelope.decide` with the relay's rule,
      :func:`kombu_ladder.plan.relay_step`): it is given the window and :meth:`fits` as
      values; without room a message takes a rung, never delivered early. The relay
      then calls :meth:`step` with the verdict, which changes the holder's state.
    * The byte budget: a message is held while the held bytes stay within it, or
      when nothing is held (a message bigger than the whole budget is still held,
      alone). :attr:`full` tells the relay to take no new messages (back-pressure)
      until :attr:`roomy` (half the budget free again).
    * Each entry is what the relay holds of a delivery (its message and the decision
      to deliver it, encoded when it is due); the message stays unacked until that
      publish is sent at the due time and confirmed, so a crash or a
      lost channel gives it back to the broker, which redelivers it: holding never
      loses one.
    * One wakeup at a time (:class:`Alarm`, set with :meth:`wake_with`) calls the
      relay back when the earliest held message falls due; a driver without timers
      asks :meth:`next_wakeup` instead.
    """

    def __init__(self, *, window_ms: int, capacity: int, budget: int = HOLD_BYTES) -> None:
        #: Below this many ms from its due time, a message is held (0 turns holding off).
        self.window_ms = window_ms
        #: How many messages may be held at once; 0 when holding is off.
        self.capacity = capacity if window_ms else 0
        #: How many bytes (bodies and properties) may be held at once.
        self.budget = budget
        #: The bytes held now.
        self.bytes = 0
        #: A message within the window was not held for want of bytes (cleared once half the budget is free).
        self._refused = False
        #: Called with seconds from now when a new earliest message is held; None: nobody is woken.
        self.wakeup: Optional[Alarm] = None
        self._heap: list[tuple[int, int, Any, int]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def fits(self, size: int) -> bool:
        """Whether a message of ``size`` bytes may be held now (room by count and by bytes)."""
        if len(self._heap) >= self.capacity:
            return False
        return not self._heap or self.bytes + size <= self.budget

    @property
    def full(self) -> bool:
        """Whether the held bytes reached the budget, or a message was refused for its bytes since half the
        budget was last free: the relay should take no new messages."""
        return bool(self._heap) and (self._refused or self.bytes >= self.budget)

    @property
    def roomy(self) -> bool:
        """Whether at most half the budget is held: a relay that stopped taking messages may take them again."""
        return self.bytes <= self.budget // 2

    def room(self, largest: int) -> int:
        """How many messages the relay's consumer window leaves room for, beyond its prefetch, to be held.

        Each is reckoned at ``largest`` bytes (the largest lately seen, at least :data:`FLOOR_BYTES`): the room
        never takes more than the budget's free bytes, nor the free count. Within that it is twice what is
        held, at least :data:`MIN_ROOM`: a relay holding little keeps a small window, so a burst of big
        messages finds few of them on their way when it stops taking messages.
        """
        if not self.capacity:
            return 0
        free_count = self.capacity - len(self._heap)
        free_bytes = max(0, self.budget - self.bytes) // max(largest, FLOOR_BYTES)
        return max(0, min(free_count, free_bytes, max(MIN_ROOM, 2 * len(self._heap))))

    def step(self, verdict: Any) -> None:
        """Act on a verdict after it was made (:func:`~kombu_ladder.envelope.decide`, given :meth:`fits` as a
        value): a message within the window that had no room for its bytes (while the count had room) makes
        the relay take no new messages until half the budget is free (see :attr:`full`)."""
        if getattr(verdict, "unheld", False) and len(self._heap) < self.capacity:
            self._refused = True

    def hold(self, due_ms: int, item: Any, now: float, size: int = 0) -> None:
        """Hold ``item`` (``size`` bytes) until ``due_ms``; wake the relay then if it is now the earliest
        (``now``: clock seconds)."""
        heapq.heappush(self._heap, (due_ms, next(self._order), item, size))
        self.bytes += size
        if self.wakeup is not None and self._heap[0][2] is item:
            self.wakeup(max(0.0, due_ms / 1000 - now))

    def wake_with(self, schedule: Optional[Schedule], fire: Callable[[], None], clock: Callable[[], float]) -> None:
        """Call ``fire`` through ``schedule`` (one entry at a time) when held messages fall due; None stops that."""
        if self.wakeup is not None:
            self.wakeup.cancel()
        self.wakeup = None if schedule is None else Alarm(schedule, fire, clock)

    def next_wakeup(self, now: float) -> Optional[float]:
        """Seconds from ``now`` until the earliest held message is due (0 when it is), or None when none is held."""
        return max(0.0, self._heap[0][0] / 1000 - now) if self._heap else None

    def take_due(self, now: float) -> list[Any]:
        """Remove and return the items due at ``now`` (clock seconds) or before, earliest first; the
        wakeup is set for the next one."""
        heap, out, now_ms = self._heap, [], int(now * 1000)
        while heap and heap[0][0] <= now_ms:
            _, _, item, size = heapq.heappop(heap)
            self.bytes -= size
            out.append(item)
        self._refused = self._refused and not self.roomy
        if self.wakeup is not None and heap:
            self.wakeup(max(0.0, heap[0][0] / 1000 - now))
        return out

    def release(self) -> list[Any]:
        """Remove and return everything held, earliest first (the messages go back to the broker)."""
        return [item for _, item in self.release_with_due()]

    def release_with_due(self) -> list[tuple[int, Any]]:
        """Remove and return everything held as (due time in epoch ms, item), earliest first."""
        out = [(entry[0], entry[2]) for entry in sorted(self._heap, key=lambda entry: entry[:2])]
        self._heap = []
        self.bytes = 0
        self._refused = False
        return out
