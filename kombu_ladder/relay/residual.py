"""The relay holds a message's last residual (below the hold window) and delivers it at its due time."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .. import timing
from ..timing import HOLD
from .alarm import Alarm, Schedule
from .holding import Held
from .pending import Publish
from .settle import CONNECTION_ERRORS, guarded

__all__ = ["Residuals"]

logger = logging.getLogger("kombu_ladder.relay")


class Residuals:
    """The holding half of :class:`~kombu_ladder.relay.RelayCore` (mixed into it, which owns the state).

    * :meth:`_plan` is the relay's rung rule: :func:`kombu_ladder.timing.step`,
      which allows for the broker's expiry lag and holds what is below the window
      while there is room.
    * A held delivery is published when :meth:`fire` runs at or after its due
      time; the driver calls :meth:`fire` then: it asks :meth:`next_wakeup`, or
      is told through :attr:`wakeup` when a new earliest message is held.
    * The message stays unacked until that publish is confirmed, so a crash
      redelivers it; :meth:`_release_held` gives every held message back on stop.
    """

    clock: Callable[[], float]
    _consume: Any
    held: Held
    hold_window_ms: int
    #: Called with seconds from now when a new earliest message is held (a driver's timer), or None;
    #: set with :meth:`wake_with`.
    wakeup: Optional[Alarm]
    #: Set by :meth:`_plan` when it decided to hold: the due time (epoch ms), until the decision is used.
    _hold_due: Optional[int]

    def _init_holding(self, hold_window: float, hold_capacity: int) -> None:
        self.hold_window_ms = round(timing.check_hold_window(hold_window) * 1000)
        self.held = Held(timing.check_hold_capacity(hold_capacity) if self.hold_window_ms else 0)
        self.wakeup = None
        self._hold_due = None

    def _plan(self, due_ms: int, now_ms: int) -> Optional[int]:
        """The relay's rung for a message due at ``due_ms``, None to deliver (now, or held until due)."""
        decision = timing.step(due_ms - now_ms, hold_window_ms=self.hold_window_ms, can_hold=self.held.room())
        if decision is HOLD:
            self._hold_due = due_ms
            return None
        return decision if isinstance(decision, int) else None

    def _deliver_or_hold(self, publish: Publish) -> None:
        """Send a delivery now, or hold it until its due time when :meth:`_plan` said so."""
        due, self._hold_due = self._hold_due, None
        if due is None:
            self._send(publish)
            return
        if self.held.add(due, publish) and self.wakeup is not None:
            self.wakeup(max(0.0, due / 1000 - self.clock()))

    def wake_with(self, schedule: Optional[Schedule]) -> None:
        """Have a driver's timer run :meth:`fire` when held messages fall due, or stop that (None).

        ``schedule(seconds, callback)`` sets one entry in the driver's loop. The
        relay keeps at most one pending (:class:`~kombu_ladder.relay.alarm.Alarm`):
        in a Celery worker they share the hub's timer with the tasks' ETAs.
        """
        if self.wakeup is not None:
            self.wakeup.cancel()
        self.wakeup = None if schedule is None else Alarm(schedule, self.fire, self.clock)

    def next_wakeup(self) -> Optional[float]:
        """Seconds until the earliest held message is due (0 when it is), or None when none is held."""
        due = self.held.next_due()
        return None if due is None else max(0.0, due / 1000 - self.clock())

    @guarded("held deliveries")
    def fire(self) -> None:
        """Publish every held delivery that is due (the driver calls this at the due time)."""
        for publish in self.held.pop_due(int(self.clock() * 1000)):
            if not self._cancelled_while_held(publish):
                self._send(publish)
        if self.wakeup is not None:
            wait = self.next_wakeup()
            if wait is not None:
                self.wakeup(wait)

    def _release_held(self) -> None:
        """Give every held message back to the broker (requeued at once, for any relay to take)."""
        channel = self._consume
        for publish in self.held.clear():
            job = publish.job
            self.pending.jobs.pop(job.tag, None)
            if channel is None:
                continue
            try:
                channel.basic_reject(job.tag, requeue=True)
            except CONNECTION_ERRORS:
                logger.debug("requeueing a held message failed; the broker requeues it with the channel")
                channel = None

    # provided by the other layers of RelayCore
    pending: Any

    def _send(self, publish: Publish) -> None:
        raise NotImplementedError

    def _cancelled_while_held(self, publish: Publish) -> bool:
        raise NotImplementedError
