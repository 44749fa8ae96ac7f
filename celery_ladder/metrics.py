"""The workers' Prometheus metrics, served by the relay step from the worker's main process."""

from __future__ import annotations

from typing import Any, Callable, Optional

from celery.utils.log import get_logger

from kombu_ladder.errors import LadderError
from kombu_ladder.relay import Counters

from .adoption import adoption_counts
from .publish import scheduled_count
from .settings import LadderSettings

__all__ = ["serve_metrics", "NotServed"]

logger = get_logger(__name__)

E_NOT_SERVED = "ladder metrics not served (the relay runs on without them): %s"


class NotServed:
    """Stands for a metrics server when ``ladder_metrics_port`` is unset or the server could not start."""

    def stop(self) -> None:
        """Nothing to stop."""


def serve_metrics(settings: LadderSettings, counters: Counters, connection: Any, *,
                  enforcing: Optional[Callable[[], bool]] = None) -> Any:
    """Serve ``counters`` on the settings' ``ladder_metrics_port`` (and ``ladder_metrics_address``) if set.

    The relay step runs in the worker's main process (the consumer), whatever the
    pool, so one server per worker serves its relay's counters, the number of
    tasks the worker (its pool processes included) put into the ladder or adopted, and the
    queue depths sampled on a clone of ``connection``. A server that cannot start
    (the port is taken, prometheus-client is missing) is logged as an error and
    the worker runs on. ``enforcing`` says whether the relay enforces cancellations now.

    Returns:
        The started :class:`kombu_ladder.metrics.MetricsServer`, or a :class:`NotServed`.
    """
    if settings.metrics_port is None:
        return NotServed()
    try:
        from kombu_ladder.metrics import MetricsServer

        return MetricsServer(counters, connection, port=settings.metrics_port, address=settings.metrics_address,
                             extra=lambda: {"scheduled": scheduled_count(), **adoption_counts()},
                             enforcing=enforcing).start()
    except (ModuleNotFoundError, LadderError) as exc:
        logger.error(E_NOT_SERVED, exc)
        return NotServed()
