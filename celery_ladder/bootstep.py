"""LadderRelay: the ladder's relay as a consumer bootstep, on the worker's own connection."""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from kombu_ladder.observe import cancellations_enforced
from kombu_ladder.relay import Relay
from kombu_ladder.relay.driver import Later

from .metrics import serve_metrics
from .settings import LadderSettings

__all__ = ["LadderRelay"]


class LadderRelay(bootsteps.StartStopStep):
    """Relay expired ladder messages from a worker, on its consumer connection (several workers compete).

    The relay, a :class:`kombu_ladder.relay.Relay`, is built once: its counters outlive reconnects.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        c.ladder_relay = None
        self.metrics: Any = None  # serves /metrics once started, when ladder_metrics_port is set
        self.settings = LadderSettings.from_conf(c.app.conf)
        self.relay = Relay(options=self.settings.relay_options())
        self.counters = self.relay.counters  # what ``celery inspect ladder`` reports
        super().__init__(c, **kwargs)

    def enforcing(self) -> bool:
        """Whether the relay enforces cancellations now (reads ladder.cancellations)."""
        return cancellations_enforced(self.relay.core)

    def include_if(self, c: Any) -> bool:
        return self.settings.runs_relay(getattr(c, "pool", None))  # -P ladder, or ladder_relay

    def start(self, c: Any) -> None:
        if self.relay.run_on(c.connection, c.connection.channel(), _later(c)):
            c.ladder_relay = self
            self.metrics = self.metrics or serve_metrics(self.settings, self.counters, c.connection,
                                                         enforcing=self.enforcing)

    def stop(self, c: Any) -> None:
        self.relay.stop()

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
