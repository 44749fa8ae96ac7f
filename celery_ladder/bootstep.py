"""LadderRelay: the ladder's relay as a consumer bootstep, on the worker's own connection."""

from __future__ import annotations

import time
from typing import Any

from celery import bootsteps
from celery.utils.log import get_logger

from kombu_ladder.contract import CONTROL
from kombu_ladder.errors import TopologyConflict
from kombu_ladder.relay import Counters, RelayCore
from kombu_ladder.targets import ExchangeCheck
from kombu_ladder.topology import declare

from .metrics import serve_metrics
from .settings import LadderSettings

__all__ = ["LadderRelay", "STOP_GRACE"]

logger = get_logger(__name__)

E_CONFLICT = "ladder relay not started: the broker's ladder topology conflicts with the contract: %s"
I_STARTED = "ladder relay consuming from %s (prefetch %d, publisher confirms)"
I_STOPPED = "ladder relay stopped: %s"

#: Seconds a stopping relay waits for outstanding confirms, so a clean stop duplicates nothing.
STOP_GRACE = 2.0

#: Seconds between the relay's ticks (back-offs, log summaries), run in the consumer's thread.
TICK = 1.0


class LadderRelay(bootsteps.ConsumerStep):
    """Relay expired ladder messages from inside a worker.

    It consumes ``acemq.schedule.due`` on a channel of the worker's consumer
    connection, so it starts, stops and reconnects with the consumer. Several
    workers make competing relays. The relay itself is
    :class:`kombu_ladder.relay.RelayCore`; its counters outlive reconnects.
    """

    def __init__(self, c: Any, **kwargs: Any) -> None:
        c.ladder_relay = None
        self.counters = Counters()
        settings = LadderSettings.from_conf(c.app.conf)
        #: The queue profile the relay declares (ladder_queue_type).
        self.queue_type = settings.queue_type
        self.core = RelayCore(counters=self.counters, allowed_exchanges=settings.allowed_exchanges,
                              max_delay=settings.max_delay)
        #: Parks deliveries to a missing exchange (or one the worker may not write) before a
        #: publish there would close the relay's channel (see kombu_ladder.targets).
        self.exchange_check: Any = None
        self._ticker: Any = None
        #: Serves /metrics once started, when ladder_metrics_port is set (see celery_ladder.metrics).
        self.metrics: Any = None
        super().__init__(c, **kwargs)

    def include_if(self, c: Any) -> bool:
        from .pool import TaskPool  # -P ladder always means "with the relay"

        return isinstance(getattr(c, "pool", None), TaskPool) or LadderSettings.from_conf(c.app.conf).relay

    def get_consumers(self, channel: Any) -> list[Any]:
        return [self.core.consumer(channel)]

    def start(self, c: Any) -> None:
        channel = c.connection.channel()
        try:
            declare(channel, queue_type=self.queue_type)
        except TopologyConflict as exc:
            logger.error(E_CONFLICT, exc)
            self.consumers = []
            return
        if self.exchange_check is None:
            self.exchange_check = ExchangeCheck(c.connection.clone())
        self.exchange_check.forget()  # (re)connecting: an exchange may have gone meanwhile
        self.core.exchange_check = self.exchange_check
        self.consumers = self.get_consumers(channel)
        for consumer in self.consumers:
            consumer.consume()
        # Ticks run where the relay's frames are read: the event loop (hub), or the consumer's
        # own loop, which runs what call_soon queued (a timer thread only queues it).
        hub = getattr(c, "hub", None)
        self._ticker = (hub.call_repeatedly(TICK, self.core.tick) if hub is not None
                        else c.timer.call_repeatedly(TICK, c.call_soon, (self.core.tick,)))
        c.ladder_relay = self
        logger.info(I_STARTED, CONTROL, self.core.prefetch)
        if self.metrics is None:
            self.metrics = serve_metrics(c.app, self.counters, c.connection)

    def stop(self, c: Any) -> None:
        self._finish(c)
        super().stop(c)
        self.consumers = []

    def shutdown(self, c: Any) -> None:
        self._finish(c)
        if self.exchange_check is not None:
            self.exchange_check.close()
        if self.metrics is not None:
            self.metrics.stop()
        super().shutdown(c)
        self.consumers = []

    def _finish(self, c: Any) -> None:
        """Stop taking expiries, then give outstanding confirms a moment to arrive."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if not self.consumers:
            return
        connection = getattr(c, "connection", None)
        for consumer in self.consumers:
            try:
                consumer.cancel()
            except Exception:  # noqa: BLE001 - a lost connection: the broker requeues anyway
                logger.debug("cancelling the relay consumer failed", exc_info=True)
        deadline = time.monotonic() + STOP_GRACE
        while self.core.outstanding and connection is not None and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=0.1)
            except TimeoutError:
                continue
            except Exception:  # noqa: BLE001 - a dying connection: the broker requeues the rest
                break
        self.core.close()
        logger.info(I_STOPPED, self.counters.as_dict())
