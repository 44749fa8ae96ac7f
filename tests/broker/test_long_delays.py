"""Long delays as users write them: years ahead hop an hour at a time; a unit mistake is parked."""

from __future__ import annotations

from typing import Any

from backends import depth, get
from kombu import Producer

from kombu_ladder import Scheduler
from kombu_ladder.plan import MAX_DELAY

YEAR_MS = 365 * 86_400_000


def foreign(conn: Any, body: bytes, due: int) -> None:
    """Publish an expired message into the control queue as another AceMQ library would."""
    Producer(conn.default_channel).publish(
        body, exchange="", routing_key="acemq.schedule.due", content_type="text/plain",
        headers={"x-schedule-exchange": "", "x-schedule-routing-key": "t.long",
                 "x-schedule-due-at": due, "x-schedule-content-type": "text/plain"},
    )


def drain(conn: Any, queue: str) -> list[Any]:
    out = []
    while (message := get(conn, queue)) is not None:
        out.append(message)
    return out


def test_a_foreign_message_due_two_years_ahead_hops_and_one_in_microseconds_is_parked(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        now_ms = int(ladder_backend.clock() * 1000)
        foreign(conn, b"two years", now_ms + 2 * YEAR_MS)
        foreign(conn, b"microseconds", now_ms * 1000)
        ladder_backend.wait_until(lambda: sched.hops == 1 and sched.parked == 1, 20, "one hop and one parking")
        [waiting] = drain(conn, "acemq.schedule.1h")
        assert waiting.body == b"two years"
        assert waiting.headers["x-schedule-due-at"] == now_ms + 2 * YEAR_MS
        [parked] = drain(conn, "acemq.schedule.parked")
        assert parked.body == b"microseconds"
        reason = parked.headers["x-ladder-parked-reason"]
        assert reason.startswith("malformed: header x-schedule-due-at=")
        assert f"max_delay of {MAX_DELAY}s" in reason
        assert (sched.delivered, sched.malformed) == (0, 1)
    with ladder_backend.connection() as conn:
        assert depth(conn, "acemq.schedule.due") == 0


def test_a_relay_with_a_lower_max_delay_parks_what_lies_past_it(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, \
            Scheduler.on(conn, clock=ladder_backend.clock, max_delay=7 * 86400) as sched:
        now_ms = int(ladder_backend.clock() * 1000)
        foreign(conn, b"six days", now_ms + 6 * 86_400_000)
        foreign(conn, b"eight days", now_ms + 8 * 86_400_000)
        ladder_backend.wait_until(lambda: sched.hops == 1 and sched.parked == 1, 20, "one hop and one parking")
        assert [m.body for m in drain(conn, "acemq.schedule.1h")] == [b"six days"]
        [parked] = drain(conn, "acemq.schedule.parked")
        assert parked.body == b"eight days"
        assert "max_delay of 604800s" in parked.headers["x-ladder-parked-reason"]


def test_a_celery_eta_two_years_ahead_waits_in_the_ladder(ladder_celery: Any) -> None:
    from datetime import timedelta

    from celery import shared_task

    @shared_task(name="long.renew")
    def renew(contract: int) -> int:
        return contract

    eta = ladder_celery.broker.datetime() + timedelta(days=2 * 365)
    renew.apply_async((9,), eta=eta)  # vanilla Celery accepts it; so must the ladder
    [waiting] = ladder_celery.broker.messages("acemq.schedule.1h")
    assert waiting.headers["x-schedule-due-at"] == int(eta.timestamp() * 1000)
    assert ladder_celery.delivered() == []
