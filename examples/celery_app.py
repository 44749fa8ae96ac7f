"""Celery quickstart: countdown= and eta= wait in RabbitMQ, not in a worker.

Start a worker (the relay runs inside it), then send a task::

    cd examples
    celery -A celery_app worker -P ladder --loglevel=INFO
    python celery_app.py

``BROKER_URL`` overrides the broker (default: RabbitMQ on localhost).
"""

from __future__ import annotations

import os

from celery import Celery

import celery_ladder

app = Celery(
    "celery_app",
    broker=os.environ.get("BROKER_URL", "amqp://guest:guest@localhost//"),
    backend="rpc://",
)
# This quickstart's own queue. A delayed task outlives the worker that sent it:
# when it falls due it goes to whichever worker consumes its queue then.
app.conf.task_default_queue = "quickstart-celery"
# apply_async(countdown=/eta=) and retry(countdown=) now go via the ladder.
celery_ladder.install(app)


@app.task
def remind(text: str) -> str:
    """Return the reminder; runs when it is due."""
    return f"reminded: {text}"


if __name__ == "__main__":
    result = remind.apply_async(("pay the invoice",), countdown=5)
    print(result.get(timeout=60))
