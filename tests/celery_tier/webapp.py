"""The app of the web console's browser test: ``celery -A webapp worker -P ladder`` and ``celery -A webapp ladder web``
(the index on, so the console finds what the test schedules)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

__all__ = ["app", "make_app", "WEB_QUEUE"]

#: The queue the worker consumes.
WEB_QUEUE = "web-q"


def make_app(broker_url: str) -> Celery:
    """The app, with ``webapp.when``: it reports when it ran and with what."""
    app = Celery("webapp", broker=broker_url, backend="rpc://", set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                    worker_prefetch_multiplier=1, ladder_index=True, task_default_queue=WEB_QUEUE)

    @app.task(bind=True, name="webapp.when", shared=False)
    def when(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"at": time.time(), "eta": self.request.eta, "args": list(args), "kwargs": kwargs}

    return app


app = make_app(os.environ.get("LADDER_POOL_BROKER", "memory://"))
