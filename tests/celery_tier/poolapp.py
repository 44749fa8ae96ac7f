"""A plain Celery app (no install): ``celery -A poolapp worker -P ladder`` must bring the relay by itself."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

__all__ = ["app", "make_app", "POOL_QUEUE"]

#: The queue the ``-P ladder`` worker consumes with ``-Q``.
POOL_QUEUE = "pool-q"


def make_app(broker_url: str) -> Celery:
    """The app, with a ``when`` task that reports when, where and in which process it ran."""
    app = Celery("poolapp", broker=broker_url, backend="rpc://", set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                    worker_prefetch_multiplier=1)
    if os.environ.get("LADDER_POOL_METRICS_PORT"):  # the workers' relay serves /metrics there
        app.conf.ladder_metrics_port = os.environ["LADDER_POOL_METRICS_PORT"]
    if os.environ.get("LADDER_POOL_ALLOWED"):  # a JSON list: the relay's target allow-list
        app.conf.ladder_allowed_exchanges = json.loads(os.environ["LADDER_POOL_ALLOWED"])

    @app.task(bind=True, name="poolapp.when", shared=False)
    def when(self: Any) -> dict[str, Any]:
        info = self.request.delivery_info or {}
        return {"at": time.time(), "eta": self.request.eta, "routing_key": info.get("routing_key"),
                "pid": os.getpid()}

    return app


app = make_app(os.environ.get("LADDER_POOL_BROKER", "memory://"))
