"""An app whose queue turns Celery's native delayed delivery on (Celery 5.5+): quorum, topic, confirms.

No install: ``celery -A nativeapp worker -P ladder`` brings the relay by itself; the
test process installs the ladder on its own copy of the app (the producer side).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

__all__ = ["app", "make_app", "NATIVE_QUEUE", "NATIVE_EXCHANGE", "NATIVE_KEY"]

#: The quorum queue the worker consumes, bound to a topic exchange.
NATIVE_QUEUE = "native-q"
NATIVE_EXCHANGE = "native-x"
NATIVE_KEY = "native.task"


def make_app(broker_url: str) -> Celery:
    """The app, with a ``when`` task that reports when and with which routing key it ran."""
    app = Celery("nativeapp", broker=broker_url, backend="rpc://", set_as_current=False)
    queue = Queue(NATIVE_QUEUE, Exchange(NATIVE_EXCHANGE, type="topic"), routing_key=NATIVE_KEY,
                  queue_arguments={"x-queue-type": "quorum"})
    app.conf.update(
        task_queues=[queue], task_default_queue=NATIVE_QUEUE, task_default_exchange=NATIVE_EXCHANGE,
        task_default_exchange_type="topic", task_default_routing_key=NATIVE_KEY,
        task_default_queue_type="quorum", broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
    )

    @app.task(bind=True, name="nativeapp.when", shared=False)
    def when(self: Any) -> dict[str, Any]:
        info = self.request.delivery_info or {}
        return {"at": time.time(), "eta": self.request.eta, "routing_key": info.get("routing_key"),
                "exchange": info.get("exchange")}

    return app


app = make_app(os.environ.get("LADDER_POOL_BROKER", "memory://"))
