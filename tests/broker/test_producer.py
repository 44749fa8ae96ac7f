"""LadderProducer behaviour: pass-through, immediate delivery, what a message in a rung carries."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from backends import declare_target, get
from kombu import Exchange

from kombu_ladder import LadderProducer, Scheduler, declare

LADDER_QUEUES = ["acemq.schedule.1h", "acemq.schedule.10m", "acemq.schedule.1m", "acemq.schedule.10s",
                 "acemq.schedule.1s", "acemq.schedule.due"]


def rung_contents(conn: Any) -> dict[str, list[Any]]:
    """Drain every ladder queue and return what was in each."""
    out: dict[str, list[Any]] = {}
    for name in LADDER_QUEUES:
        while (message := get(conn, name)) is not None:
            out.setdefault(name, []).append(message)
    return out


def test_publish_without_countdown_or_eta_passes_through_unchanged(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.pass")
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish({"n": 1}, exchange="", routing_key="t.pass", headers={"app": "h"},
                         correlation_id="c-1", type="MyType", expiration=60, delivery_mode=1)
        message = ladder_backend.wait_until(lambda: get(conn, "t.pass"), 10, "the pass-through message")
        assert json.loads(message.body) == {"n": 1}
        assert message.content_type == "application/json"
        assert message.headers == {"app": "h"}
        assert message.properties["correlation_id"] == "c-1"
        assert message.properties["type"] == "MyType"
        assert message.properties["delivery_mode"] == 1
        assert message.properties["expiration"] == "60000"
        assert rung_contents(conn) == {}


@pytest.mark.parametrize("when", [{"countdown": 0}, {"countdown": -5}, {"countdown": 0.999},
                                  {"countdown": timedelta(seconds=-1)}, {"eta": "past"}])
def test_due_now_delivers_at_once_without_a_relay(ladder_backend: Any, when: dict[str, Any]) -> None:
    if when.get("eta") == "past":
        when = {"eta": datetime.fromtimestamp(ladder_backend.clock() - 60, timezone.utc)}
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.now")
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish(b"now", routing_key="t.now", headers={"app": "h"}, **when)
        message = get(conn, "t.now")  # no relay runs, so it can only have come straight
        assert message is not None
        assert message.body == b"now"
        assert message.headers == {"app": "h"}
        assert rung_contents(conn) == {}


@pytest.mark.parametrize(
    "delay,rung",
    [
        (1.5, "acemq.schedule.1s"),
        (30, "acemq.schedule.10s"),
        (90, "acemq.schedule.1m"),
        (timedelta(minutes=12), "acemq.schedule.10m"),
        (4 * 3600, "acemq.schedule.1h"),
        # Exactly a rung's length waits in that rung (one clock reading, not a millisecond short of it).
        (3600, "acemq.schedule.1h"),
        (600, "acemq.schedule.10m"),
        (60, "acemq.schedule.1m"),
        (10, "acemq.schedule.10s"),
        (1, "acemq.schedule.1s"),
    ],
)
def test_delayed_publish_waits_in_the_right_rung_with_the_contract_headers(
    ladder_backend: Any, delay: Any, rung: str
) -> None:
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        before = ladder_backend.clock()
        sched.in_(delay, {"invoice": 7}, routing_key="invoice.due", exchange="billing",
                  headers={"app": "h"}, expiration=5, correlation_id="c-9")
        after = ladder_backend.clock()
        contents = rung_contents(conn)
        assert list(contents) == [rung]
        [message] = contents[rung]
        headers = message.headers
        due = headers.pop("x-schedule-due-at")
        assert isinstance(due, int)
        assert int(before * 1000) + int(seconds * 1000) - 1 <= due <= int(after * 1000) + int(seconds * 1000) + 1
        assert headers == {
            "x-schedule-exchange": "billing",
            "x-schedule-routing-key": "invoice.due",
            "x-schedule-content-type": "application/json",
            "app": "h",
        }
        assert json.loads(message.body) == {"invoice": 7}
        assert message.properties["type"] == "ScheduledMessage"
        assert message.properties["delivery_mode"] == 2
        assert message.properties.get("expiration") is None
        assert message.properties["correlation_id"] == "c-9"


def test_delayed_publish_with_an_exchange_object_and_eta(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock, serializer="pickle")
        eta = datetime.fromtimestamp(ladder_backend.clock() + 45, timezone.utc)
        producer.publish("text", exchange=Exchange("billing", type="direct"), routing_key="k", eta=eta,
                         serializer="json", delivery_mode="transient")
        [message] = rung_contents(conn)["acemq.schedule.10s"]
        assert message.headers["x-schedule-exchange"] == "billing"
        assert message.headers["x-schedule-due-at"] == int(eta.timestamp() * 1000)
        assert message.headers["x-ladder-delivery-mode"] == 1
        assert message.properties["delivery_mode"] == 2
        assert json.loads(message.body) == "text"


def test_topology_is_declared_before_the_first_delayed_publish(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        channel = conn.channel()
        for name in [*LADDER_QUEUES, "acemq.schedule.parked"]:
            channel.queue_delete(queue=name)
        channel.exchange_delete(exchange="acemq.schedule")
        channel.close()
    with ladder_backend.connection() as fresh:
        producer = LadderProducer(fresh.default_channel, clock=ladder_backend.clock)
        producer.publish(b"x", routing_key="t.fresh", countdown=30)
        producer.publish(b"y", routing_key="t.fresh", countdown=30)
        contents = rung_contents(fresh)
        assert [m.body for m in contents["acemq.schedule.10s"]] == [b"x", b"y"]
        assert fresh.default_channel.queue_declare(queue="acemq.schedule.parked", passive=True)[0]


@pytest.mark.parametrize(
    "kwargs,error,name",
    [
        ({"countdown": float("nan")}, ValueError, "countdown"),
        ({"countdown": float("inf")}, ValueError, "countdown"),
        ({"countdown": "10"}, TypeError, "countdown"),
        ({"eta": datetime(2030, 1, 1)}, ValueError, "eta"),
        ({"countdown": 10, "routing_key": ""}, ValueError, "routing_key"),
        ({"countdown": 400 * 86_400_000}, ValueError, "countdown"),  # 400 days in milliseconds
    ],
)
def test_producer_bad_input(ladder_backend: Any, kwargs: dict[str, Any], error: type, name: str) -> None:
    with ladder_backend.connection() as conn:
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        kwargs.setdefault("routing_key", "t.bad")
        with pytest.raises(error, match=name):
            producer.publish(b"x", **kwargs)


def test_a_delay_of_two_years_waits_in_the_hour_rung_with_its_due_time(ladder_backend: Any) -> None:
    two_years = 2 * 365 * 86400
    with ladder_backend.connection() as conn:
        declare(conn)
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        now_ms = int(ladder_backend.clock() * 1000)
        producer.publish(b"later", exchange="billing", routing_key="invoice", countdown=two_years)
        contents = rung_contents(conn)
        assert list(contents) == ["acemq.schedule.1h"]
        due = contents["acemq.schedule.1h"][0].headers["x-schedule-due-at"]
        assert 0 <= due - (now_ms + two_years * 1000) < 1000


def test_max_delay_keyword_lowers_and_raises_the_limit(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        declare(conn)
        short = LadderProducer(conn.default_channel, clock=ladder_backend.clock, max_delay=3600)
        with pytest.raises(ValueError, match="countdown=3601s is longer than the maximum delay of 3600s"):
            short.publish(b"x", routing_key="t.bad", countdown=3601)
        long = LadderProducer(conn.default_channel, clock=ladder_backend.clock, max_delay=20 * 365 * 86400)
        long.publish(b"y", exchange="billing", routing_key="invoice", countdown=15 * 365 * 86400)
        assert [m.body for m in rung_contents(conn)["acemq.schedule.1h"]] == [b"y"]
        with pytest.raises(ValueError, match="max_delay"):
            LadderProducer(conn.default_channel, max_delay=0)
