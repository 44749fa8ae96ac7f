"""A Celery app for fault tests: one task that appends its argument to a file, with or without the ladder."""

from __future__ import annotations

import json
import os
from typing import Optional

from celery import Celery

import celery_ladder

__all__ = ["app", "make_app"]


def make_app(broker_url: str, *, ladder: bool = True, allowed: Optional[list[str]] = None,
             exclusive_control: bool = False, acks_late: bool = False) -> Celery:
    """Return the fault-test app on ``broker_url``; ``ladder=False`` is vanilla Celery.

    ``allowed`` becomes ``ladder_allowed_exchanges``; ``exclusive_control`` sets Celery's
    ``control_queue_exclusive`` (5.6+: remote-control queues that RabbitMQ 4.3 still accepts);
    ``acks_late`` sets ``task_acks_late`` (Celery's default acks a task as it starts, so a worker
    killed while it runs loses that task, with the ladder or without it).
    """
    celery = Celery("faultapp", broker=broker_url)
    celery.conf.update(
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        task_default_queue="faults.tasks",
        worker_prefetch_multiplier=4,
        ladder_allowed_exchanges=allowed,
        control_queue_exclusive=exclusive_control,
        task_acks_late=acks_late,
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
_allowed = os.environ.get("LADDER_FAULT_ALLOWED")
app = make_app(os.environ.get("LADDER_FAULT_BROKER", "memory://"),
               ladder=os.environ.get("LADDER_FAULT_VANILLA") != "1",
               allowed=json.loads(_allowed) if _allowed else None,
               exclusive_control=os.environ.get("LADDER_FAULT_EXCLUSIVE_CONTROL") == "1",
               acks_late=os.environ.get("LADDER_FAULT_ACKS_LATE") == "1")
