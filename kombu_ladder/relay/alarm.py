"""One timer at a time for the relay's held messages, in a driver's event loop (no I/O)."""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["Alarm", "Schedule"]

#: ``schedule(seconds, callback)``: set one timer entry in a driver's loop; return it (``cancel()``), or anything.
Schedule = Callable[[float, Callable[[], None]], Any]


class Alarm:
    """The relay's ``wakeup(seconds)`` on a driver's timer, keeping at most one of its entries pending.

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
