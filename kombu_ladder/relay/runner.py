"""Relay: a standalone relay on a connection of its own, reconnecting by itself (kombu's ConsumerMixin)."""

from __future__ import annotations

import logging
import signal
import time
from functools import partial
from typing import Any, Callable, Iterable, Optional

from kombu.mixins import ConsumerMixin

from ..brokers import clock_of
from ..contract import PREFETCH
from ..plan import MAX_DELAY
from ..timing import HOLD_CAPACITY, HOLD_WINDOW
from ..topology import check_queue_type, declare
from .driven import I_STOPPED, STOP_GRACE, DrivenRelay, Driver
from .wakeup import consume as _consume_on_time

__all__ = ["Relay", "STOP_GRACE"]

logger = logging.getLogger("kombu_ladder.relay")

I_COUNTERS = "relay counters: %s"
I_SIGNAL = "received %s, stopping the relay"

#: Seconds between the relay's ticks (back-offs, log summaries), at the most.
TICK = 0.25


class Relay(Driver, ConsumerMixin):
    """A standalone relay on its own connection; reconnects by itself.

    Run it with :meth:`run` (blocking) and stop it from another thread or a
    signal handler with :meth:`stop`. The relay itself is a
    :class:`~kombu_ladder.relay.driven.DrivenRelay`; this class only drives it.
    """

    def __init__(
        self,
        connection: Any,
        *,
        clock: Optional[Callable[[], float]] = None,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        report_every: Optional[float] = None,
        max_delay: float = MAX_DELAY,
        hold_window: float = HOLD_WINDOW,
        hold_capacity: int = HOLD_CAPACITY,
        queue_type: str = "classic",
    ) -> None:
        self.connection = connection
        #: The profile the relay declares: "classic" (the contract) or "quorum" (see :func:`declare`).
        self.queue_type = check_queue_type(queue_type)
        self.relay = DrivenRelay(clock=clock_of(connection, clock), prefetch=prefetch, max_delay=max_delay,
                                 allowed_exchanges=allowed_exchanges,
                                 check_clock=clock_of(connection, default=time.monotonic),
                                 declare_topology=partial(declare, queue_type=self.queue_type),
                                 hold_window=hold_window, hold_capacity=hold_capacity)
        self.report_every = report_every
        self._last_report = self._last_tick = time.monotonic()
        #: Set once the relay consumes from the control queue.
        self.ready = self.core.consuming

    def run(self, _tokens: int = 1, **kwargs: Any) -> None:
        """Consume until :meth:`stop`, reconnecting as needed (kombu's ConsumerMixin loop)."""
        try:
            super().run(_tokens, **kwargs)
        finally:
            self.relay.close()

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        """kombu's consume loop, waking when a held message is due (issue 14; see relay.wakeup)."""
        return _consume_on_time(self, self.core, *args, **kwargs)

    def get_consumers(self, Consumer: Any, channel: Any) -> list[Any]:  # noqa: N803 - kombu's name
        return [self.relay.attach(self.connection, channel)]

    def on_iteration(self) -> None:
        now = time.monotonic()
        if now - self._last_tick >= TICK:
            self._last_tick = now
            self.relay.tick()
        if self.report_every is not None and time.monotonic() - self._last_report >= self.report_every:
            self._last_report = time.monotonic()
            logger.info(I_COUNTERS, self.counters.as_dict())

    def on_consume_end(self, connection: Any, channel: Any) -> None:
        """Wait briefly for outstanding confirms, so a clean stop duplicates nothing."""
        self.relay.drain(connection)
        logger.info(I_COUNTERS, self.counters.as_dict())

    def stop(self) -> None:
        """Ask the relay to stop; :meth:`run` returns within about a second."""
        self.should_stop = True

    def run_until_signalled(self) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly (main thread only: it installs the handlers)."""

        def stop(signum: int, frame: Any) -> None:
            logger.info(I_SIGNAL, signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.run()
        logger.info(I_STOPPED, self.counters.as_dict())
