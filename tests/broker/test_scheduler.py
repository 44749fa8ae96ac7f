"""Scheduler behaviour: counters, str(), running, close(), the context manager, bad input."""

from __future__ import annotations

import math
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from backends import declare_target, depth, get

from kombu_ladder import Scheduler


def test_counters_and_str(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.counters")
        assert str(sched) == "Scheduler{rungs=1h, 10m, 1m, 10s, 1s, scheduled=0, delivered=0}"
        sched.in_(1.2, b"soon", routing_key="t.counters")
        sched.in_(3700, b"later", routing_key="t.counters")
        sched.at(datetime.fromtimestamp(ladder_backend.clock() + 7200, timezone.utc), b"much later",
                 routing_key="t.counters")
        assert sched.scheduled == 3
        ladder_backend.wait_until(lambda: sched.delivered == 1, 20, "the short one delivered")
        assert str(sched) == "Scheduler{rungs=1h, 10m, 1m, 10s, 1s, scheduled=3, delivered=1}"
        assert repr(sched) == "<Scheduler{rungs=1h, 10m, 1m, 10s, 1s, scheduled=3, delivered=1}>"
        assert (sched.hops, sched.malformed, sched.parked) == (0, 0, 0)
        assert get(conn, "t.counters").body == b"soon"
        assert depth(conn, "acemq.schedule.1h") == 2


def test_scheduler_is_safe_to_share_between_threads(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(25):
                    sched.in_(3600, f"{n}-{i}".encode(), routing_key="t.threads")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not [t for t in threads if t.is_alive()], "a publishing thread hung"
        assert errors == []
        assert sched.scheduled == 200
        assert depth(conn, "acemq.schedule.1h") == 200


def test_counters_are_read_only(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        for name in ("scheduled", "delivered", "hops", "malformed", "parked", "running"):
            with pytest.raises(AttributeError):
                setattr(sched, name, 5)


def test_running_close_and_context_manager(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        before = {t.name for t in threading.enumerate() if t.is_alive()}
        with Scheduler.on(conn, clock=ladder_backend.clock) as sched:
            assert sched.running
            assert "kombu-ladder-relay" in {t.name for t in threading.enumerate()}
            assert depth_consumers(conn, "acemq.schedule.due") == 1
        assert not sched.running
        assert depth_consumers(conn, "acemq.schedule.due") == 0
        assert {t.name for t in threading.enumerate() if t.is_alive()} <= before
        with pytest.raises(RuntimeError, match="closed"):
            sched.in_(5, b"x", routing_key="t.closed")
        sched.close()  # twice is fine
        assert not sched.running

        plain = Scheduler.on(conn, relay=False, clock=ladder_backend.clock)
        assert plain.running
        plain.close()
        assert not plain.running


def depth_consumers(conn: Any, queue: str) -> int:
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True)[2])
    finally:
        channel.close()


NAIVE = datetime(2030, 1, 1, 12, 0)


@pytest.mark.parametrize(
    "method,when,kwargs,error,name",
    [
        ("in_", math.nan, {}, ValueError, "countdown|delay"),
        ("in_", math.inf, {}, ValueError, "countdown|delay"),
        ("in_", -math.inf, {}, ValueError, "countdown|delay"),
        ("in_", "10", {}, TypeError, "countdown|delay"),
        ("in_", None, {}, TypeError, "countdown|delay"),
        ("in_", 400 * 86_400_000, {}, ValueError, "countdown|delay"),  # 400 days in milliseconds
        ("in_", timedelta(days=3654), {}, ValueError, "countdown|delay"),
        ("in_", 10, {"routing_key": ""}, ValueError, "routing_key"),
        ("in_", 10, {"routing_key": None}, TypeError, "routing_key"),
        ("in_", 10, {"routing_key": 5}, TypeError, "routing_key"),
        ("in_", 10, {"exchange": None}, TypeError, "exchange"),
        ("at", NAIVE, {}, ValueError, "eta|when"),
        ("at", "2030-01-01", {}, TypeError, "eta|when"),
        ("at", 1_900_000_000, {}, TypeError, "eta|when"),
        ("at", None, {}, TypeError, "eta|when"),
        ("at", datetime(2099, 1, 1, tzinfo=timezone.utc), {}, ValueError, "eta|when"),
    ],
)
def test_bad_input_names_the_argument(
    ladder_backend: Any, method: str, when: Any, kwargs: dict[str, Any], error: type, name: str
) -> None:
    kwargs = {"routing_key": "t.bad", **kwargs}
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        with pytest.raises(error, match=name):
            getattr(sched, method)(when, b"x", **kwargs)
        assert sched.scheduled == 0


def test_missing_routing_key_is_a_type_error(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        with pytest.raises(TypeError, match="routing_key"):
            sched.in_(10, b"x")  # type: ignore[call-arg]


def test_empty_routing_key_is_fine_with_a_named_exchange(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        sched.in_(30, b"x", routing_key="", exchange="billing")
        assert sched.scheduled == 1
        message = get(conn, "acemq.schedule.10s")
        assert message.headers["x-schedule-routing-key"] == ""
        assert message.headers["x-schedule-exchange"] == "billing"
