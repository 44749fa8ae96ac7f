"""Reschedule a waiting message, or run it now: the same message, once, at its new time (simulator)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from backends import Arrivals, SimulatorBackend, declare_target

from kombu_ladder import Scheduler
from kombu_ladder.contract import CONTROL, DUE_AT, rung_name
from kombu_ladder.peek import find
from kombu_ladder.rescheduling import due_from, moved_headers, reschedule

HOUR = 3600.0


@pytest.fixture()
def backend() -> SimulatorBackend:
    backend = SimulatorBackend()
    yield backend
    backend.close()


def test_run_now_takes_a_message_out_of_the_1h_rung_and_delivers_it_within_a_second(backend: SimulatorBackend) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.now")
        with Scheduler.on(conn, clock=backend.clock) as sched:
            sched.in_(2 * HOUR, b"before", routing_key="t.now", message_id="before")
            sched.in_(2 * HOUR, b"it", routing_key="t.now", message_id="it", headers={"tenant": 42},
                      priority=3, correlation_id="corr-1")
            sched.in_(2 * HOUR, b"after", routing_key="t.now", message_id="after")
            asked = backend.clock()
            result = sched.run_now("it")
            assert result.found is not None and result.found.queue == rung_name(3600)
            assert result.found.position == 2 and result.due_at == int(asked * 1000)
            arrivals = Arrivals(backend, conn, "t.now")
            (_, at, message), = arrivals.wait(1, 5)
            assert at - asked < 1.0
            assert message.body == b"it" and message.properties["message_id"] == "it"
            assert message.properties["correlation_id"] == "corr-1" and message.properties["priority"] == 3
            assert message.headers.get("tenant") == 42 and DUE_AT not in message.headers
            # The others wait where they were, in their order, and nothing else arrives.
            backend.broker.advance(60)
            assert arrivals.poll() == 1
            assert [find(conn, ident).found[0].position for ident in ("before", "after")] == [1, 2]
            backend.wait_until(lambda: arrivals.poll() >= 3, 3 * HOUR, "the others on their time")
            backend.broker.advance(HOUR)
            assert sorted(m.properties["message_id"] for m in arrivals.messages) == ["after", "before", "it"]


def test_reschedule_later_and_earlier_delivers_once_at_the_new_time(backend: SimulatorBackend) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.move")
        with Scheduler.on(conn, clock=backend.clock) as sched:
            start = backend.clock()
            sched.in_(30, b"later", routing_key="t.move", message_id="later")
            sched.in_(HOUR, b"earlier", routing_key="t.move", message_id="earlier")
            assert sched.reschedule("later", 95).found is not None  # from now: due 95 s after start
            when = datetime.fromtimestamp(start + 600, timezone.utc)
            assert sched.reschedule("earlier", when).found is not None
            arrivals = Arrivals(backend, conn, "t.move")
            seen = arrivals.wait(2, 2 * HOUR)
            backend.broker.advance(2 * HOUR)
            assert arrivals.poll() == 2, "each once: the original is gone"
            times = {m.properties["message_id"]: at - start for _, at, m in seen}
            assert 95 <= times["later"] < 96.1
            assert 600 <= times["earlier"] < 601.1


def test_an_unknown_id_moves_nothing(backend: SimulatorBackend) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.none")
        with Scheduler.on(conn, relay=False, clock=backend.clock) as sched:
            sched.in_(HOUR, b"x", routing_key="t.none", message_id="x")
            result = sched.reschedule("nobody", 5)
            assert result.found is None and result.looked_at == 1 and not result.truncated
            assert reschedule(conn, "x", 5, clock=backend.clock).found is not None


def test_a_celery_task_keeps_its_id_and_gets_its_new_eta() -> None:
    headers = {"id": "t-1", "task": "app.send_invoice", "eta": "2026-12-02T10:00:00+00:00", DUE_AT: 1}
    moved = moved_headers(headers, 1_800_000_000_000)
    assert moved["id"] == "t-1" and moved[DUE_AT] == 1_800_000_000_000
    assert datetime.fromisoformat(moved["eta"]) == datetime.fromtimestamp(1_800_000_000, timezone.utc)
    assert "eta" not in moved_headers({DUE_AT: 1}, 5) and headers[DUE_AT] == 1, "a copy, not the original"


@pytest.mark.parametrize("bad,error", [("soon", TypeError), (float("nan"), ValueError),
                                       (datetime(2030, 1, 1), ValueError),
                                       (datetime(2100, 1, 1, tzinfo=timezone.utc), ValueError)])
def test_a_bad_time_is_refused_naming_the_argument(bad: object, error: type) -> None:
    with pytest.raises(error, match="when"):
        due_from(bad, 1_800_000_000.0)  # type: ignore[arg-type]


def test_a_time_in_the_past_is_now() -> None:
    assert due_from(datetime(2020, 1, 1, tzinfo=timezone.utc), 1_800_000_000.0) == 1_800_000_000_000
    assert due_from(-5, 1_800_000_000.0) == 1_800_000_000_000


def test_the_control_queue_is_searched_too(backend: SimulatorBackend) -> None:
    """A message that expired while no relay ran waits in acemq.schedule.due: it can still be moved."""
    with backend.connection() as conn:
        declare_target(conn, "t.ctl")
        with Scheduler.on(conn, relay=False, clock=backend.clock) as sched:
            sched.in_(5, b"c", routing_key="t.ctl", message_id="c")
            backend.broker.advance(10)
            result = sched.reschedule("c", HOUR)
            assert result.found is not None and result.found.queue == CONTROL
