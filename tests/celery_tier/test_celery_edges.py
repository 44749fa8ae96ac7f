"""Celery's semantics at the edges, each with the ladder and beside vanilla Celery: the same outcome (issue 23).

Every test runs twice (``ladder_mode``): with ``celery_ladder.install`` and without. The
assertions are the same; where the paths differ (the vanilla worker holds the task in memory,
the ladder keeps it in RabbitMQ), the test says so.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest
from celery import chain, chord
from celery.exceptions import TaskRevokedError
from celery.utils.time import maybe_iso8601
from helpers import ladder_counters, queue_depth, wait_for, wait_for_counters
from kombu import Connection

from celery_ladder.publish import scheduled_count
from kombu_ladder.contract import rung_names

pytestmark = [pytest.mark.broker, pytest.mark.celery]

#: How late a task may run after its ETA (the worker's timer and the relay's delivery), and how early.
LATE, EARLY = 1.5, 0.02


@pytest.fixture(params=["vanilla", "ladder"])
def ladder_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def held_by_worker(app: Any, worker: Any) -> set[str]:
    """The ids of the ETA tasks ``worker`` holds in memory (``celery inspect scheduled``)."""
    answer = app.control.inspect(destination=[worker.hostname], timeout=2).scheduled() or {}
    return {entry["request"]["id"] for entry in answer.get(worker.hostname, [])}


def in_ladder(app: Any, ladder_mode: str) -> int:
    """Messages waiting on the rungs; a vanilla app never declares them, so a missing rung counts as empty
    there (with the ladder, a missing rung is an error)."""
    missing = {"if_missing": 0} if ladder_mode == "vanilla" else {}
    with Connection(app.conf.broker_url) as conn:
        return sum(queue_depth(conn, rung, **missing) for rung in rung_names())


def lateness(run: Any, eta: Optional[datetime] = None) -> float:
    """Seconds between a run and its ETA (the request's, or ``eta``)."""
    return float(run.at - (eta or maybe_iso8601(run.eta)).timestamp())


def check_path(app: Any, worker: Any, mode: str, task_id: str) -> None:
    """While a task waits: in the ladder, never in the worker (ladder); in the worker's memory (vanilla)."""
    held = task_id in held_by_worker(app, worker)
    assert held is (mode == "vanilla"), f"{mode}: held by the worker = {held}"


def test_a_task_that_expires_while_it_waits_is_revoked_as_expired(celery_app: Any, celery_worker: Any,
                                                                 ladder_mode: str) -> None:
    result = celery_app.tasks["t.stamp"].apply_async(("expired",), countdown=4, expires=2)
    kept = celery_app.tasks["t.stamp"].apply_async(("kept",), countdown=4, expires=60)
    check_path(celery_app, celery_worker, ladder_mode, result.id)
    wait_for(lambda: result.state == "REVOKED", timeout=15, message="the task to be revoked as expired")
    with pytest.raises(TaskRevokedError, match="expired"):
        result.get(timeout=1, propagate=True)
    assert kept.get(timeout=15) and celery_app.recorder.of("expired") == []


def test_an_eta_in_the_past_runs_at_once(celery_app: Any, celery_worker: Any, ladder_mode: str) -> None:
    eta = datetime.now(timezone.utc) - timedelta(seconds=60)
    scheduled = scheduled_count()
    result = celery_app.tasks["t.stamp"].apply_async(("past",), eta=eta)
    result.get(timeout=10)
    (run,) = celery_app.recorder.of("past")
    assert maybe_iso8601(run.eta) == eta and 60 <= lateness(run) <= 60 + LATE
    assert in_ladder(celery_app, ladder_mode) == 0, "nothing waits: a task due already goes straight to its queue"
    assert scheduled_count() - scheduled == (1 if ladder_mode == "ladder" else 0)


@pytest.mark.parametrize("celery_overrides", [{"enable_utc": False, "timezone": "America/New_York"}])
def test_a_naive_eta_without_utc_and_a_non_utc_timezone(celery_app: Any, celery_worker: Any, ladder_mode: str,
                                                        celery_overrides: dict[str, Any]) -> None:
    """Celery reads a naive ``eta`` as UTC whatever ``timezone`` says; the ladder delivers at that same moment."""
    naive = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=4)
    result = celery_app.tasks["t.stamp"].apply_async(("naive",), eta=naive)
    check_path(celery_app, celery_worker, ladder_mode, result.id)
    result.get(timeout=20)
    (run,) = celery_app.recorder.of("naive")
    assert -EARLY <= lateness(run, naive.replace(tzinfo=timezone.utc)) <= LATE


def test_a_countdown_shorter_than_the_hold_window(celery_app: Any, celery_worker: Any, ladder_mode: str) -> None:
    host = celery_worker.hostname
    # Only a worker with the ladder answers "inspect ladder" (vanilla: check_path shows the worker held it).
    before = ladder_counters(celery_app, [host])[host] if ladder_mode == "ladder" else None
    result = celery_app.tasks["t.stamp"].apply_async(("short",), countdown=3)
    check_path(celery_app, celery_worker, ladder_mode, result.id)
    result.get(timeout=15)
    (run,) = celery_app.recorder.of("short")
    assert -EARLY <= lateness(run) <= LATE
    if before is not None:  # a delivery is counted once confirmed, which may come after the task ran
        after = wait_for_counters(celery_app, [host], lambda c: c[host]["delivered"] > before["delivered"],
                                  message="the relay to count its confirmed delivery")[host]
        assert after["delivered"] - before["delivered"] == 1


def test_a_chain_whose_members_carry_countdowns(celery_app: Any, celery_worker: Any, ladder_mode: str) -> None:
    add = celery_app.tasks["t.add"]
    result = chain(add.s(1, 2).set(countdown=2), add.s(10).set(countdown=3), add.s(100).set(countdown=1))()
    assert result.get(timeout=30) == 113
    runs = [celery_app.recorder.of(label)[0] for label in ("add 1 2", "add 3 10", "add 13 100")]
    assert all(-EARLY <= lateness(run) <= LATE for run in runs), "each member runs at its own ETA"
    assert runs[1].at - runs[0].at >= 3 - EARLY and runs[2].at - runs[1].at >= 1 - EARLY, \
        "each countdown counts from the end of the member before it"


def test_a_chord_whose_header_and_body_carry_countdowns(celery_app: Any, celery_worker: Any,
                                                        ladder_mode: str) -> None:
    add, total = celery_app.tasks["t.add"], celery_app.tasks["t.total"]
    header = [add.s(1, 1).set(countdown=3), add.s(2, 2).set(countdown=1), add.s(3, 3)]
    result = chord(header)(total.s().set(countdown=2))
    assert result.get(timeout=30) == 12
    (body,) = celery_app.recorder.of("total")
    last = max(celery_app.recorder.of(f"add {n} {n}")[0].at for n in (1, 2, 3))
    assert body.at - last >= 2 - EARLY and -EARLY <= lateness(body) <= LATE


@pytest.mark.parametrize("celery_overrides", [{"task_always_eager": True}])
def test_task_always_eager_runs_at_once_and_never_touches_the_ladder(celery_app: Any, ladder_mode: str,
                                                                     celery_overrides: dict[str, Any]) -> None:
    scheduled = scheduled_count()
    result = celery_app.tasks["t.stamp"].apply_async(("eager",), countdown=600)
    assert result.successful() and len(celery_app.recorder.of("eager")) == 1
    assert scheduled_count() == scheduled and in_ladder(celery_app, ladder_mode) == 0
