"""retry(countdown=), autoretry backoff, and countdowns in chains and callbacks, through the ladder."""

from __future__ import annotations

from typing import Any

import pytest
from celery import chain
from helpers import wait_for

from celery_ladder.publish import scheduled_count

from .recording import relay_of

pytestmark = [pytest.mark.broker, pytest.mark.celery]

#: How late a run may be after its countdown (the worker absorbs the ladder's residual).
MAX_LATE = 1.5


def test_retry_with_countdown_three_times_keeps_its_route_and_gathers_no_death_headers(
        celery_app: Any, celery_worker: Any) -> None:
    before = scheduled_count()
    celery_app.tasks["t.flaky"].delay("r", 3)
    wait_for(lambda: len(celery_app.recorder.of("r")) == 4, timeout=30, message="three retries and a success")
    runs = sorted(celery_app.recorder.of("r"), key=lambda r: r.retries)
    assert [r.retries for r in runs] == [0, 1, 2, 3]
    for previous, run in zip(runs, runs[1:]):
        assert 1 - 0.02 <= run.at - previous.at <= 1 + MAX_LATE
    assert {(r.exchange, r.routing_key) for r in runs} == {("", "celery")}, "the routing key must not grow"
    assert all(r.headers == {} for r in runs), f"no x- header may reach the task: {[r.headers for r in runs]}"
    assert scheduled_count() - before == 3, "each retry is published through the ladder hook"


def test_autoretry_backoff_waits_one_then_two_seconds(celery_app: Any, celery_worker: Any) -> None:
    relay = relay_of(celery_worker)
    delivered = relay.counters.delivered
    celery_app.tasks["t.backoff"].delay("b")
    wait_for(lambda: len(celery_app.recorder.of("b")) == 3, timeout=30, message="two backoff retries")
    runs = sorted(celery_app.recorder.of("b"), key=lambda r: r.retries)
    gaps = [b.at - a.at for a, b in zip(runs, runs[1:])]
    assert 1 - 0.02 <= gaps[0] <= 1 + MAX_LATE and 2 - 0.02 <= gaps[1] <= 2 + MAX_LATE, gaps
    # the 2 s backoff waits in a rung and is relayed (counted once the broker confirms the delivery)
    wait_for(lambda: relay.counters.delivered > delivered, timeout=10, message="the relay to count the backoff")


def test_countdown_in_a_chain_and_in_a_callback(celery_app: Any, celery_worker: Any) -> None:
    stamp = celery_app.tasks["t.stamp"]
    relay = relay_of(celery_worker)
    delivered = relay.counters.delivered
    chain(stamp.si("c1"), stamp.si("c2").set(countdown=3)).apply_async()
    stamp.apply_async(("l1",), link=stamp.si("l2").set(countdown=2))
    stamp.apply_async(("probe",), countdown=1.5, headers={"x-probe": 1})
    wait_for(lambda: {"c1", "c2", "l1", "l2", "probe"} <= celery_app.recorder.labels(), timeout=30,
             message="the chain and the callback")
    (c1,), (c2,) = celery_app.recorder.of("c1"), celery_app.recorder.of("c2")
    (l1,), (l2,) = celery_app.recorder.of("l1"), celery_app.recorder.of("l2")
    assert 3 - 0.02 <= c2.at - c1.at <= 3 + MAX_LATE
    assert 2 - 0.02 <= l2.at - l1.at <= 2 + MAX_LATE
    assert c2.eta is not None and l2.eta is not None
    (probe,) = celery_app.recorder.of("probe")
    assert probe.headers == {"x-probe": 1}, "application headers survive the ladder (and the recorder sees them)"
    # both delayed signatures and the probe came through the relay (counted once confirmed)
    wait_for(lambda: relay.counters.delivered - delivered >= 3, timeout=10, message="the relay to count all three")
