"""LadderRelay: the ladder's relay as a consumer bootstep, on the worker's own connection."""

from __future__ import annotations

from functools import partial
from typing import Any

from celery import bootsteps

from kombu_ladder.relay.driven import DrivenRelay, Later
from kombu_ladder.topology import declare

from .metrics import serve_metrics
from .settings import LadderSettings

__all__ = ["LadderRelay"]


class LadderRelay(bootsteps.StartStopStep):
    """Relay expired ladder messages from a worker, on its consumer connection (several workers compete).

    The relay, a :class:`kombu_ladder.relay.driven.DrivenRelay`, is built once: its counters outlive reconnects.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        c.ladder_relay = None
        self.metrics: Any = None  # serves /metrics once started, when ladder_metrics_port is set
        self.settings = s = LadderSettings.from_conf(c.app.conf)
        self.relay = DrivenRelay(allowed_exchanges=s.allowed_exchanges, max_delay=s.max_delay,
                                 hold_window=s.hold_window, declare_topology=partial(declare, queue_type=s.queue_type))
        self.counters = self.relay.counters  # what ``celery inspect ladder`` reports
        super().__init__(c, **kwargs)

    def include_if(self, c: Any) -> bool:
        return getattr(getattr(c, "pool", None), "with_relay", False) or self.settings.relay  # -P ladder

    def start(self, c: Any) -> None:
        if self.relay.run_on(c.connection, c.connection.channel(), _later(c)):
            c.ladder_relay = self
            self.metrics = self.metrics or serve_metrics(self.settings, self.counters, c.connection)

    def stop(self, c: Any) -> None:
        self.relay.stop(getattr(c, "connection", None))

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        self.relay.close()
        self.metrics = self.metrics and self.metrics.stop()


def _later(c: Any) -> Later:
    """Run a function later where the relay's frames are read: the worker's hub, or its consumer loop."""
    hub = getattr(c, "hub", None)
    if hub is not None:
        return hub.call_later  # type: ignore[no-any-return]
    return lambda seconds, function: c.timer.call_after(seconds, c.call_soon, (function,))
