"""A Celery app for the adoption tests: without the ladder (an old producer), its task noting each run in a file.

``celery -A adoptapp worker -P ladder`` brings the relay and adoption by itself. With
``LADDER_ADOPT_DIE_AT`` set to ``before-commit`` or ``after-commit``, the worker kills
itself with SIGKILL at that step of its first adoption, as ``kill -9`` would.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from celery import Celery

__all__ = ["app", "make_app", "ADOPT_QUEUE", "runs"]

#: The queue the app's tasks go to (and its workers consume).
ADOPT_QUEUE = "adopt-q"


def make_app(broker_url: str) -> Celery:
    """The app, with an ``adopt.record(n)`` task that appends a line about its run to ``$LADDER_ADOPT_RUNS``."""
    app = Celery("adoptapp", broker=broker_url, set_as_current=False)
    app.conf.update(task_default_queue=ADOPT_QUEUE, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False, worker_prefetch_multiplier=4)

    @app.task(bind=True, name="adopt.record", shared=False)
    def record(self: Any, n: int) -> None:
        line = {"n": n, "id": self.request.id, "at": time.time(), "eta": self.request.eta,
                "headers": sorted(self.request.headers or ()),
                "routing_key": (self.request.delivery_info or {}).get("routing_key")}
        with open(os.environ["LADDER_ADOPT_RUNS"], "a") as out:
            out.write(json.dumps(line) + "\n")

    return app


def runs(path: str) -> list[dict[str, Any]]:
    """The runs noted in ``path``, in order."""
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _die_at(point: str) -> None:
    """Kill this worker with SIGKILL at ``point`` of its first adoption transaction."""
    from celery_ladder.adoption.transfer import Mover

    commit = Mover.commit

    def dying(self: Mover) -> None:
        if point == "after-commit":
            commit(self)
        os.kill(os.getpid(), signal.SIGKILL)

    Mover.commit = dying  # type: ignore[method-assign]


if os.environ.get("LADDER_ADOPT_DIE_AT"):
    _die_at(os.environ["LADDER_ADOPT_DIE_AT"])

app = make_app(os.environ.get("LADDER_ADOPT_BROKER", "memory://"))
