"""Prometheus metrics of a relay, read from its :class:`~kombu_ladder.relay.Counters` (needs the prometheus extra)."""

from __future__ import annotations

import logging
from importlib.util import find_spec
from typing import Any, Callable, Iterator, Optional

from .controlplane import KINDS
from .controlplane.codec import REASONS as SKIP_REASONS
from .controlplane.reader import SKIPS, Skips
from .errors import LadderError, missing_extra
from .observe import LATENESS_BUCKETS, REASONS

E_NO_PROMETHEUS = missing_extra("the metrics endpoint", "prometheus", "prometheus_client", "prometheus-client>=0.17,<1")

if find_spec("prometheus_client") is None:  # say what to install, in one line
    raise ModuleNotFoundError(E_NO_PROMETHEUS, name="prometheus_client")

from prometheus_client import make_wsgi_app  # noqa: E402 - after the check above
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily  # noqa: E402
from prometheus_client.registry import Collector, CollectorRegistry  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402

from .relay.counters import Counters  # noqa: E402
from .sampler import DEFAULT_INTERVAL, QueueSampler  # noqa: E402
from .serving import MAX_CONNECTIONS, READ_TIMEOUT, serve  # noqa: E402

__all__ = ["LadderCollector", "MetricsServer", "MetricsError", "METRIC_NAMES", "DEFAULT_ADDRESS", "E_NO_PROMETHEUS"]

logger = logging.getLogger(__name__)

I_SERVING = "serving the ladder's metrics on http://%s:%d/metrics"
E_BIND = "cannot serve the ladder's metrics on {address}:{port}: {reason}"

#: Where ``/metrics`` listens unless told otherwise: this host only.
DEFAULT_ADDRESS = "127.0.0.1"

#: Help text of each counter of :class:`~kombu_ladder.relay.Counters`, exported as ``ladder_<name>_total``.
COUNTER_HELP = {
    "received": "Expired messages the relay took from acemq.schedule.due.",
    "delivered": "Messages delivered to their target, confirmed by the broker.",
    "hops": "Times the relay put a message back into a rung, confirmed by the broker.",
    "malformed": "Messages without valid x-schedule-* headers (parked, also counted in ladder_parked_total).",
    "parked": ("Messages parked in acemq.schedule.parked (confirmed by the broker), by reason: malformed, "
               "unroutable (no such exchange, queue or binding), refused (the allow-list, or a target that refused "
               "every try) or other; the message's x-ladder-parked-reason has the whole reason."),
    "refused": "Deliveries the broker refused (nack); each is retried or parked.",
    "cancelled": "Cancelled messages (ids in ladder.cancellations) the relay dropped at a hop or at delivery.",
    "scheduled": "Messages this process (a Celery worker: its pool processes included) put into the ladder.",
    "adopted": "ETA tasks sent without the ladder that this worker moved into it.",
    "originals_dropped": "Redelivered originals of tasks this worker's fleet had adopted, acked without running.",
}

#: Every metric family this module exports (a dashboard may query these, with the suffixes below).
METRIC_NAMES: tuple[str, ...] = (
    *(f"ladder_{name}_total" for name in ("received", "delivered", "hops", "malformed", "parked", "refused",
                                          "cancelled")),
    "ladder_delivery_lateness_seconds",
    "ladder_queue_messages",
    "ladder_queue_consumers",
    "ladder_queue_sampled_timestamp_seconds",
    "ladder_queue_sample_errors_total",
    "ladder_cancellations_enforced",
    "ladder_control_records_skipped_total",
)

#: Help text of ``ladder_control_records_skipped_total``.
SKIPPED_HELP = ("Records of the control plane's streams this process skipped, by stream, kind and reason: malformed, "
                "size (bigger than its kind allows), unknown (a kind or version this release does not read) or "
                "exchange (not written through its kind's exchange: forged).")


class MetricsError(LadderError):
    """The metrics cannot be served (the port is taken, the address is not this host's)."""


class LadderCollector(Collector):
    """Yields the ladder's metrics from a relay's counters and a queue sampler, at each scrape.

    Nothing is copied: a scrape reads the same :class:`~kombu_ladder.relay.Counters`
    that ``inspect ladder`` and the relay's log line read, and the sampler's last
    sample (a scrape never asks the broker).

    Arguments:
        counters: the relay's counters.
        sampler: the queue sampler, if queue depths are exported.
        extra: more counters of this process, ``{name: value}``, exported as ``ladder_<name>_total``.
        enforcing: whether the relay enforces cancellations now (it reads ``ladder.cancellations``),
            exported as the gauge ``ladder_cancellations_enforced`` (1 or 0); see
            :func:`kombu_ladder.observe.cancellations_enforced`.
        skips: the control-plane records skipped by this process's readers (default: every reader's,
            :data:`kombu_ladder.controlplane.reader.SKIPS`), exported as ``ladder_control_records_skipped_total``.
    """

    def __init__(self, counters: Counters, sampler: Optional[QueueSampler] = None, *,
                 extra: Optional[Callable[[], dict[str, int]]] = None,
                 enforcing: Optional[Callable[[], bool]] = None, skips: Skips = SKIPS) -> None:
        self.counters = counters
        self.sampler = sampler
        self.extra = extra
        self.enforcing = enforcing
        self.skips = skips

    def collect(self) -> Iterator[Any]:
        counters = self.counters
        values = {**counters.as_dict(), **(self.extra() if self.extra is not None else {})}
        for name, value in values.items():
            if name == "parked":
                continue
            yield CounterMetricFamily(f"ladder_{name}", COUNTER_HELP.get(name, f"The relay's {name} counter."),
                                      value=value)
        parked = CounterMetricFamily("ladder_parked", COUNTER_HELP["parked"], labels=["reason"])
        for reason in REASONS:
            parked.add_metric([reason], counters.parked_reasons.get(reason, 0))
        yield parked
        if self.enforcing is not None:
            yield GaugeMetricFamily("ladder_cancellations_enforced", "1 while the relay reads ladder.cancellations "
                                    "and drops cancelled messages, 0 while it cannot (cancelled messages are "
                                    "delivered).", value=1 if self.enforcing() else 0)
        skipped = CounterMetricFamily("ladder_control_records_skipped", SKIPPED_HELP,
                                      labels=["stream", "kind", "reason"])
        counts = dict.fromkeys(((stream, kind.name, reason) for kind in KINDS for stream in kind.streams
                                for reason in SKIP_REASONS), 0)  # every series, from zero
        counts.update(self.skips.as_dict())
        for (stream, kind_name, reason), count in sorted(counts.items()):
            skipped.add_metric([stream, kind_name, reason], count)
        yield skipped
        yield self._lateness()
        if self.sampler is not None:
            yield from self._queues(self.sampler)

    def _lateness(self) -> HistogramMetricFamily:
        cumulative, _ = self.counters.lateness.snapshot()
        bounds = [floatToGoString(b) for b in LATENESS_BUCKETS] + ["+Inf"]
        # Negative bounds: no _sum (nor _count) is exported, as OpenMetrics requires, since a sum of
        # negative observations is no counter. The +Inf bucket is the count.
        return HistogramMetricFamily(
            "ladder_delivery_lateness_seconds",
            "Delivery time minus due time of the relay's deliveries (negative: early), in seconds.",
            buckets=list(zip(bounds, cumulative)), sum_value=None)

    def _queues(self, sampler: QueueSampler) -> Iterator[Any]:
        messages = GaugeMetricFamily("ladder_queue_messages", "Messages ready in each ladder queue (sampled).",
                                     labels=["queue"])
        consumers = GaugeMetricFamily("ladder_queue_consumers", "Consumers of each ladder queue (sampled).",
                                      labels=["queue"])
        for row in sampler.depths:
            if row.messages is not None:  # a missing queue has no depth
                messages.add_metric([row.queue], row.messages)
                consumers.add_metric([row.queue], row.consumers or 0)
        yield messages
        yield consumers
        stamp = GaugeMetricFamily("ladder_queue_sampled_timestamp_seconds",
                                  "When the queue gauges were last sampled (epoch seconds).")
        if sampler.sampled_at is not None:
            stamp.add_metric([], sampler.sampled_at)
        yield stamp
        yield CounterMetricFamily("ladder_queue_sample_errors",
                                  "Queue-depth samples that failed (the queue gauges are then absent, never stale).",
                                  value=sampler.errors)


class MetricsServer:
    """Serves ``/metrics`` over HTTP from a thread, for one relay's counters.

    Arguments:
        counters: the relay's counters.
        connection: a :class:`kombu.Connection` whose clone samples the queue depths
            every ``interval`` seconds; None exports no queue gauges.
        port: the TCP port (0: any free port; :attr:`port` tells which).
        address: the address to listen on.
        interval: seconds between two queue-depth samples.
        extra: more counters of this process (see :class:`LadderCollector`).
        enforcing: whether the relay enforces cancellations now (see :class:`LadderCollector`).
        read_timeout: seconds a connection may stay silent before it is closed.
        max_connections: connections open at once; past it the oldest idle one is closed (see
            :class:`kombu_ladder.serving.BoundedServer`), so idle sockets never exhaust the relay's
            file descriptors.
    """

    def __init__(self, counters: Counters, connection: Any = None, *, port: int, address: str = DEFAULT_ADDRESS,
                 interval: float = DEFAULT_INTERVAL, extra: Optional[Callable[[], dict[str, int]]] = None,
                 enforcing: Optional[Callable[[], bool]] = None, read_timeout: float = READ_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.address = address
        self.port = port
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.sampler = QueueSampler(connection.clone(), interval=interval) if connection is not None else None
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(LadderCollector(counters, self.sampler, extra=extra, enforcing=enforcing))
        self._httpd: Any = None

    def start(self) -> "MetricsServer":
        """Take the first queue sample, then listen: every answered scrape has every metric.

        Raises:
            MetricsError: the address or port cannot be bound.
        """
        if self.sampler is not None:
            self.sampler.start()
        try:
            self._httpd, _ = serve(make_wsgi_app(self.registry), self.address, self.port,
                                   read_timeout=self.read_timeout, max_connections=self.max_connections)
        except OSError as exc:
            if self.sampler is not None:
                self.sampler.stop()
            raise MetricsError(E_BIND.format(address=self.address, port=self.port, reason=exc)) from None
        self.port = int(self._httpd.server_port)
        logger.info(I_SERVING, self.address, self.port)
        return self

    @property
    def url(self) -> str:
        """The URL of ``/metrics``."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and sampling."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self.sampler is not None:
            self.sampler.stop()
