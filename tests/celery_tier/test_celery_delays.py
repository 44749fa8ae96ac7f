"""Countdown and ETA tasks through the ladder on a real worker: on time, never held early."""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery.utils.time import maybe_iso8601
from helpers import queue_depth, wait_for

from celery_ladder.publish import scheduled_count
from kombu_ladder.contract import rung_names

from .recording import relay_of

pytestmark = [pytest.mark.broker, pytest.mark.celery]

#: Delays in seconds, published in this (unsorted) order; even positions use countdown=, odd ones eta=.
DELAYS = (7.5, 1.2, 11.5, 3.3, 2.0, 9.0, 1.6, 5.0, 12.0, 2.7, 4.4, 6.2)

#: How late a task may run: the ladder's residual is absorbed by the worker, so this is slack for a busy machine.
MAX_LATE = 1.5

#: Timer granularity: Celery's ETA timer may fire a few milliseconds before the ETA.
TIMER_SLACK = 0.02


def _eta_ts(run: Any) -> float:
    return maybe_iso8601(run.eta).timestamp()


def _held_too_early(app: Any, hostname: str, now: float) -> list[tuple[str, float]]:
    """Tasks the worker holds in memory that are due more than ~1 s from now."""
    replies = app.control.inspect(destination=[hostname], timeout=2, limit=1).scheduled() or {}
    early = []
    for entry in replies.get(hostname, []):
        lead = maybe_iso8601(entry["eta"]).timestamp() - now
        if lead > 1.2:
            early.append((entry["request"]["id"], lead))
    return early


def test_mixed_countdown_and_eta_run_on_time_and_are_not_held_early(celery_app: Any, celery_worker: Any,
                                                                    connection: Any) -> None:
    stamp = celery_app.tasks["t.stamp"]
    before = scheduled_count()
    expected: dict[str, str] = {}
    published: dict[str, float] = {}
    for i, delay in enumerate(DELAYS):
        label = f"d{i}-{delay}"
        published[label] = time.time()
        if i % 2 == 0:
            stamp.apply_async((label,), countdown=delay)
        else:
            eta = datetime.now(timezone.utc) + timedelta(seconds=delay)
            expected[label] = eta.isoformat()
            stamp.apply_async((label,), eta=eta)
    assert scheduled_count() - before == len(DELAYS)
    waiting = sum(queue_depth(connection, name, if_missing=0) for name in rung_names())
    assert waiting >= len(DELAYS) - 2, "the ETA tasks should wait in the rungs, not in the task queue"

    early_seen: list[tuple[str, float]] = []

    def all_ran() -> bool:
        early_seen.extend(_held_too_early(celery_app, celery_worker.hostname, time.time()))
        return len(celery_app.recorder.labels()) == len(DELAYS)

    wait_for(all_ran, timeout=max(DELAYS) + 20, interval=0.5, message="every delayed task to run")
    assert early_seen == [], f"the worker held tasks more than ~1 s before their ETA: {early_seen}"

    lateness = []
    for i, delay in enumerate(DELAYS):
        label = f"d{i}-{delay}"
        (run,) = celery_app.recorder.of(label)
        if label in expected:
            assert run.eta == expected[label], "task.request.eta must be the requested ETA"
        else:
            assert abs(_eta_ts(run) - (published[label] + delay)) < 0.5
        late = run.at - _eta_ts(run)
        assert -TIMER_SLACK <= late <= MAX_LATE, f"{label} ran {late:+.3f}s from its ETA"
        assert run.routing_key == "celery" and run.exchange == ""
        lateness.append(late)
    relay = relay_of(celery_worker)
    wait_for(lambda: relay.counters.delivered >= len(DELAYS), timeout=10,
             message="the relay to count each delivery (it counts one once the broker confirms it)")
    # the relay holds every residual below its hold window (10 s): no 1 s hops
    assert relay.counters.hops < len(DELAYS)
    assert relay.counters.parked == 0 and relay.counters.malformed == 0
    print(f"\nlateness over {len(lateness)} tasks: min {min(lateness) * 1000:.1f} ms, "
          f"median {statistics.median(lateness) * 1000:.1f} ms, max {max(lateness) * 1000:.1f} ms")


def test_plain_task_is_not_stuck_behind_a_thousand_countdown_tasks(celery_app: Any, celery_worker: Any,
                                                                  connection: Any) -> None:
    stamp = celery_app.tasks["t.stamp"]
    with celery_app.producer_or_acquire() as producer:
        for i in range(1000):
            stamp.apply_async((f"later-{i}",), countdown=900, producer=producer)
    sent = time.time()
    stamp.delay("plain")
    wait_for(lambda: celery_app.recorder.of("plain"), timeout=15, message="the plain task to run")
    ran = celery_app.recorder.of("plain")[0].at
    assert ran - sent < 10, f"the plain task waited {ran - sent:.1f}s"
    # Celery publishes without confirms: on a loaded machine the last of them can still be on their way.
    wait_for(lambda: queue_depth(connection, "acemq.schedule.10m") == 1000, timeout=30,
             message="all 1000 countdown tasks to wait in the 10m rung")
    assert _held_too_early(celery_app, celery_worker.hostname, time.time()) == []
