"""LadderRelay: the ladder's relay as a consumer bootstep, on the worker's own connection."""

from __future__ import annotations

from functools import partial
from typing import Any

from celery import bootsteps
from celery.utils.log import get_logger

from kombu_ladder.errors import TopologyConflict
from kombu_ladder.relay.alarm import Alarm
from kombu_ladder.relay.driven import DrivenRelay
from kombu_ladder.topology import declare

from .metrics import serve_metrics
from .settings import LadderSettings

__all__ = ["LadderRelay"]

logger = get_logger(__name__)

E_CONFLICT = "ladder relay not started: the broker's ladder topology conflicts with the contract: %s"

#: Seconds between the relay's ticks (back-offs, log summaries), run in the consumer's thread.
TICK = 1.0


class LadderRelay(bootsteps.StartStopStep):
    """Relay expired ladder messages from a worker, on its consumer connection (several workers compete).

    The relay, a :class:`kombu_ladder.relay.driven.DrivenRelay`, is built once: its counters outlive reconnects.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        c.ladder_relay = None
        self.metrics: Any = None  # serves /metrics once started, when ladder_metrics_port is set
        self._ticker: Any = None
        self._alarm: Any = None
        self.settings = LadderSettings.from_conf(c.app.conf)
        self.relay = DrivenRelay(allowed_exchanges=self.settings.allowed_exchanges, max_delay=self.settings.max_delay,
                                 declare_topology=partial(declare, queue_type=self.settings.queue_type),
                                 hold_window=self.settings.hold_window)
        self.counters = self.relay.counters  # what ``celery inspect ladder`` reports
        super().__init__(c, **kwargs)

    def include_if(self, c: Any) -> bool:
        return getattr(getattr(c, "pool", None), "with_relay", False) or self.settings.relay  # -P ladder

    def start(self, c: Any) -> None:
        try:
            self.relay.start(c.connection, c.connection.channel())
        except TopologyConflict as exc:
            return logger.error(E_CONFLICT, exc)
        # Ticks run where the relay's frames are read: the hub, or the consumer's loop (via call_soon).
        hub, tick = getattr(c, "hub", None), self.relay.tick
        self._ticker = (hub.call_repeatedly(TICK, tick) if hub is not None
                        else c.timer.call_repeatedly(TICK, c.call_soon, (tick,)))
        # Held messages are published at their due time by one timer entry at a time in the same loop.
        self._alarm = Alarm(hub.call_later if hub is not None else
                            (lambda seconds, fire: c.timer.call_after(seconds, c.call_soon, (fire,))),
                            self.relay.core.fire, self.relay.core.clock)
        self.relay.core.wakeup = self._alarm
        c.ladder_relay = self
        self.metrics = self.metrics or serve_metrics(self.settings, self.counters, c.connection)

    def stop(self, c: Any) -> None:
        self._ticker = self._ticker and self._ticker.cancel()
        self.relay.core.wakeup = None  # stopping gives the held messages back to the broker
        self._alarm = self._alarm and self._alarm.cancel()
        self.relay.stop(getattr(c, "connection", None))

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        self.relay.close()
        self.metrics = self.metrics and self.metrics.stop()
