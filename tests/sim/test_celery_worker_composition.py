"""ladder_celery with celery.contrib.pytest's celery_app and embedded celery_worker: tasks run after advance()."""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from celery.utils.time import maybe_iso8601
from helpers import wait_for

from kombu_ladder.contract import rung_names

#: Wall-clock seconds a task that advance() made due may take to run on the embedded worker.
DEADLINE = 5.0


@shared_task(name="sim.worker.add", bind=True)
def add(self: Any, x: int, y: int) -> tuple[int, Any]:
    return x + y, self.request.eta


@shared_task(name="sim.worker.flaky", bind=True, max_retries=1)
def flaky(self: Any) -> int:
    if not self.request.retries:
        raise self.retry(countdown=30)
    return self.request.retries


def waiting_in_the_ladder(ladder_celery: Any) -> int:
    return sum(len(ladder_celery.broker.messages(rung)) for rung in rung_names())


def test_a_countdown_task_runs_on_the_embedded_worker_once_advance_made_it_due(
    celery_app: Any, celery_worker: Any, ladder_celery: Any,
) -> None:
    assert ladder_celery.app is celery_app and celery_app.conf.broker_url == ladder_celery.broker.url
    result = add.apply_async((2, 3), countdown=90)
    ladder_celery.advance(89)
    assert waiting_in_the_ladder(ladder_celery) == 1 and result.state == "PENDING"

    started = time.monotonic()
    ladder_celery.advance(2)
    total, eta = result.get(timeout=DEADLINE)
    assert total == 5 and time.monotonic() - started < DEADLINE
    # The virtual ETA: the last advance() passed it by a second, plus what the run took (a minute prefix, compared
    # before, failed when the second advance crossed a minute: '05:20:59' against '05:21').
    lag = (ladder_celery.broker.datetime() - maybe_iso8601(eta)).total_seconds()
    assert 0 <= lag < 1 + DEADLINE, (eta, lag)


def test_a_retry_from_the_embedded_worker_waits_in_the_ladder(celery_worker: Any, ladder_celery: Any) -> None:
    result = flaky.delay()
    wait_for(lambda: waiting_in_the_ladder(ladder_celery), DEADLINE, interval=0.01,
             message="the first run, on the worker's thread, to retry into the ladder")
    ladder_celery.advance(31)
    assert result.get(timeout=DEADLINE) == 1
