"""The ladder_celery fixture as a user's test suite uses it: Celery countdowns and ETAs in virtual time."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from celery import shared_task

HOUR = 3600
DAY = 24 * HOUR

#: What the tasks below did, in order.
ran: list[tuple[str, Any]] = []


@shared_task(name="sim.remind")
def remind(user: int, text: str = "hi") -> int:
    ran.append(("remind", (user, text)))
    return user


@shared_task(name="sim.follow_up")
def follow_up(order: int) -> None:
    ran.append(("follow_up", order))
    remind.apply_async((order,), {"text": "follow-up"}, countdown=HOUR)


def test_countdown_task_is_delivered_after_its_countdown_and_runs_with_its_arguments(ladder_celery: Any) -> None:
    ran.clear()
    remind.apply_async((7,), {"text": "renew"}, countdown=4 * HOUR)
    assert ladder_celery.delivered() == []
    ladder_celery.advance(4 * HOUR - 1)
    assert ladder_celery.delivered() == []
    ladder_celery.advance(1)
    (task,) = ladder_celery.delivered()
    assert (task.name, task.args, task.kwargs) == ("sim.remind", [7], {"text": "renew"})
    assert [result.get() for result in ladder_celery.run_delivered()] == [7]
    assert ran == [("remind", (7, "renew"))]
    assert ladder_celery.delivered() == []
    assert ladder_celery.broker.relays[0].counters.hops == 3  # four 1 h rungs


def test_a_task_a_day_ahead_runs_in_well_under_a_second(ladder_celery: Any) -> None:
    ran.clear()
    started = time.perf_counter()
    eta = ladder_celery.broker.datetime() + timedelta(days=1)
    remind.apply_async((1,), eta=eta)
    ladder_celery.advance(DAY)
    ladder_celery.run_delivered()
    assert ran == [("remind", (1, "hi"))]
    assert time.perf_counter() - started < 1.0


def test_short_countdown_overtakes_a_long_one_and_tasks_without_one_go_straight_through(ladder_celery: Any) -> None:
    ran.clear()
    remind.apply_async((1,), countdown=DAY)
    remind.apply_async((2,), countdown=90)
    remind.delay(3)
    assert [t.args for t in ladder_celery.delivered()] == [[3]]
    ladder_celery.advance(90)
    assert [t.args for t in ladder_celery.delivered()] == [[3], [2]]
    ladder_celery.advance(DAY - 90)
    ladder_celery.run_delivered()
    assert [args for _, args in ran] == [(3, "hi"), (2, "hi"), (1, "hi")]


def test_a_task_that_schedules_another_sends_it_through_the_ladder(ladder_celery: Any) -> None:
    ran.clear()
    follow_up.apply_async((42,), countdown=10)
    ladder_celery.advance(10)
    ladder_celery.run_delivered()
    assert ran == [("follow_up", 42)]
    assert ladder_celery.delivered() == []  # the follow-up waits in the ladder
    ladder_celery.advance(HOUR)
    ladder_celery.run_delivered()
    assert ran == [("follow_up", 42), ("remind", (42, "follow-up"))]


@shared_task(name="sim.flaky", bind=True, max_retries=3)
def flaky(self: Any, order: int) -> str:
    ran.append(("flaky", self.request.retries))
    if self.request.retries < 2:
        raise self.retry(countdown=600)
    return f"done {order}"


def test_run_as_a_worker_sends_retries_through_the_ladder(ladder_celery: Any) -> None:
    ran.clear()
    flaky.delay(5)
    ladder_celery.run_delivered(as_worker=True)
    assert ran == [("flaky", 0)] and ladder_celery.delivered() == []  # the retry waits 10 minutes
    ladder_celery.advance(599)
    assert ladder_celery.delivered() == []
    ladder_celery.advance(1)
    (retry,) = ladder_celery.delivered()
    assert (retry.name, retry.args, retry.headers["retries"]) == ("sim.flaky", [5], 1)
    ladder_celery.run_delivered(as_worker=True)
    ladder_celery.advance(600)
    assert ladder_celery.run_delivered(as_worker=True) == ["done 5"]
    assert ran == [("flaky", 0), ("flaky", 1), ("flaky", 2)]


def test_a_task_whose_expires_passed_while_it_waited_is_not_run(ladder_celery: Any) -> None:
    ran.clear()
    remind.apply_async((1,), countdown=HOUR, expires=60)
    remind.apply_async((2,), countdown=HOUR, expires=2 * HOUR)
    ladder_celery.advance(HOUR)
    assert len(ladder_celery.run_delivered()) == 1
    assert ran == [("remind", (2, "hi"))]
    assert [t.args for t in ladder_celery.expired] == [[1]]
