"""A Celery app for fault tests: one task that appends its argument to a file, with or without the ladder."""

from __future__ import annotations

import os

from celery import Celery

import celery_ladder

__all__ = ["app", "make_app"]


def make_app(broker_url: str, *, ladder: bool = True) -> Celery:
    """Return the fault-test app on ``broker_url``; ``ladder=False`` is vanilla Celery."""
    celery = Celery("faultapp", broker=broker_url)
    celery.conf.update(
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        task_default_queue="faults.tasks",
        worker_prefetch_multiplier=4,
    )
    if ladder:
        celery_ladder.install(celery)

    @celery.task(name="faults.record", shared=False)
    def record(n: int) -> int:
        with open(os.environ["LADDER_FAULT_RUNS"], "a") as runs:
            runs.write(f"{n}\n")
        return n

    return celery


#: The app a worker subprocess loads (``celery -A faultapp worker``), configured from the environment.
app = make_app(os.environ.get("LADDER_FAULT_BROKER", "memory://"),
               ladder=os.environ.get("LADDER_FAULT_VANILLA") != "1")
