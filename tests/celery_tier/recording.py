"""The Celery tier's recording tasks, its task queues and the embedded worker's relay."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from helpers import purge
from kombu import Connection

__all__ = ["TASK_QUEUES", "Run", "Recorder", "register_tasks", "purge_queues", "relay_of"]

#: Task queues the tests use; emptied before each test so leftovers never reach another test.
TASK_QUEUES = ("celery", "reports", "events.created", "urgent", "fresh")


@dataclass
class Run:
    """One execution of a recording task, as the task itself saw it."""

    label: str
    at: float  #: time.time() when the task body ran
    eta: Optional[str]  #: task.request.eta
    retries: int
    routing_key: Optional[str]
    exchange: Optional[str]
    priority: Optional[int]
    headers: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """Thread-safe log of task runs, keyed by label."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: list[Run] = []

    def add(self, run: Run) -> None:
        with self._lock:
            self.runs.append(run)

    def of(self, label: str) -> list[Run]:
        with self._lock:
            return [r for r in self.runs if r.label == label]

    def labels(self) -> set[str]:
        with self._lock:
            return {r.label for r in self.runs}


def _record(task: Any, label: str) -> Run:
    request = task.request
    info = request.delivery_info or {}
    run = Run(
        label=label, at=time.time(), eta=request.eta, retries=request.retries,
        routing_key=info.get("routing_key"), exchange=info.get("exchange"), priority=info.get("priority"),
        headers={k: v for k, v in (getattr(request, "headers", None) or {}).items() if k.startswith("x-")},
    )
    task.app.recorder.add(run)
    return run


def register_tasks(app: Any) -> None:
    """Define the recording tasks on ``app`` (``app.recorder`` collects their runs)."""

    @app.task(bind=True, name="t.stamp", shared=False)
    def stamp(self: Any, label: str) -> float:
        return _record(self, label).at

    @app.task(bind=True, name="t.report", shared=False)
    def report(self: Any, label: str) -> float:
        return _record(self, label).at

    @app.task(bind=True, name="t.flaky", max_retries=5, shared=False)
    def flaky(self: Any, label: str, times: int) -> int:
        _record(self, label)
        if self.request.retries < times:
            raise self.retry(countdown=1)
        return self.request.retries

    @app.task(bind=True, name="t.add", shared=False)
    def add(self: Any, x: int, y: int) -> int:
        _record(self, f"add {x} {y}")
        return x + y

    @app.task(bind=True, name="t.total", shared=False)
    def total(self: Any, numbers: list[int]) -> int:
        _record(self, "total")
        return sum(numbers)

    @app.task(bind=True, name="t.backoff", shared=False, autoretry_for=(ValueError,), retry_backoff=1,
              retry_jitter=False, max_retries=2)
    def backoff(self: Any, label: str) -> int:
        _record(self, label)
        if self.request.retries < 2:
            raise ValueError("not yet")
        return self.request.retries


def purge_queues(broker_url: str, names: tuple[str, ...] = TASK_QUEUES) -> None:
    """Empty the tests' task queues (missing ones are fine)."""
    with Connection(broker_url) as conn:
        purge(conn, *names)


def relay_of(worker: Any) -> Any:
    """The relay bootstep of an embedded worker (None when it does not run one)."""
    return getattr(worker.consumer, "ladder_relay", None)
