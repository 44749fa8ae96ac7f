"""Relay: a standalone relay on a connection of its own, reconnecting by itself (kombu's ConsumerMixin)."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterable, Optional

from kombu.mixins import ConsumerMixin

from ..contract import CONTROL, PREFETCH
from ..plan import MAX_DELAY
from ..targets import ExchangeCheck
from ..topology import check_queue_type, declare
from .core import RelayCore
from .counters import Counters

__all__ = ["Relay"]

logger = logging.getLogger("kombu_ladder.relay")

I_CONSUMING = "relay consuming from %s (prefetch %d)"
I_COUNTERS = "relay counters: %s"
I_SIGNAL = "received %s, stopping the relay"
I_STOPPED = "relay stopped: %s"

#: Seconds a stopping relay waits for outstanding confirms, so a clean stop duplicates nothing.
STOP_GRACE = 5.0

#: Seconds between the relay's ticks (back-offs, log summaries), at the most.
TICK = 0.25


class Relay(ConsumerMixin):
    """A standalone relay on its own connection; reconnects by itself.

    Run it with :meth:`run` (blocking) and stop it from another thread or a
    signal handler with :meth:`stop`.
    """

    def __init__(
        self,
        connection: Any,
        *,
        clock: Callable[[], float] = time.time,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        report_every: Optional[float] = None,
        max_delay: float = MAX_DELAY,
        queue_type: str = "classic",
    ) -> None:
        self.connection = connection
        #: The profile the relay declares: "classic" (the contract) or "quorum" (see :func:`declare`).
        self.queue_type = check_queue_type(queue_type)
        self.exchange_check = ExchangeCheck(connection.clone())
        self.core = RelayCore(clock=clock, prefetch=prefetch, allowed_exchanges=allowed_exchanges,
                              exchange_check=self.exchange_check, max_delay=max_delay)
        self.report_every = report_every
        self._last_report = self._last_tick = time.monotonic()
        #: Set once the relay consumes from the control queue.
        self.ready = threading.Event()

    @property
    def counters(self) -> Counters:
        """The relay's counters."""
        return self.core.counters

    def run(self, _tokens: int = 1, **kwargs: Any) -> None:
        """Consume until :meth:`stop`, reconnecting as needed (kombu's ConsumerMixin loop)."""
        try:
            super().run(_tokens, **kwargs)
        finally:
            self.exchange_check.close()

    def get_consumers(self, Consumer: Any, channel: Any) -> list[Any]:  # noqa: N803 - kombu's name
        self.exchange_check.forget()  # (re)connecting: an exchange may have gone meanwhile
        declare(channel, queue_type=self.queue_type)
        return [self.core.consumer(channel)]

    def on_consume_ready(self, connection: Any, channel: Any, consumers: Any, **kwargs: Any) -> None:
        logger.info(I_CONSUMING, CONTROL, self.core.prefetch)
        self.ready.set()

    def on_iteration(self) -> None:
        now = time.monotonic()
        if now - self._last_tick >= TICK:
            self._last_tick = now
            self.core.tick()
        if self.report_every is not None and time.monotonic() - self._last_report >= self.report_every:
            self._last_report = time.monotonic()
            logger.info(I_COUNTERS, self.counters.as_dict())

    def on_consume_end(self, connection: Any, channel: Any) -> None:
        """Wait briefly for outstanding confirms, so a clean stop duplicates nothing."""
        deadline = time.monotonic() + STOP_GRACE
        while self.core.outstanding and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=0.2)
            except (socket.timeout, TimeoutError):
                continue
            except Exception:  # noqa: BLE001 - a dying connection: the broker requeues what is left
                break
        self.core.close()
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
