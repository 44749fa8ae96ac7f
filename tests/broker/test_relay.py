"""Relay behaviour: timing of mixed delays, delivery fidelity, parking of unroutable and malformed messages."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from backends import Arrivals, declare_target, depth, get
from kombu import Exchange, Producer

from kombu_ladder import LadderProducer, Scheduler

#: How early (s) a delivery may be: the ladder is accurate to its smallest rung, early rather than late.
EARLY = 1.1
#: How late (s) a delivery may be.
LATE = 0.5


def test_short_delay_overtakes_a_long_one_published_first(ladder_backend: Any) -> None:
    clock = ladder_backend.clock
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=clock) as sched:
        declare_target(conn, "t.mixed")
        arrivals = Arrivals(ladder_backend, conn, "t.mixed")
        due = {}
        due[b"long"] = clock() + 12
        sched.in_(12, b"long", routing_key="t.mixed")
        due[b"short"] = clock() + 2
        sched.in_(2, b"short", routing_key="t.mixed")
        arrivals.wait(2, timeout=30)
        assert [m.body for m in arrivals.messages] == [b"short", b"long"]
        for _, arrived, message in arrivals.seen:
            lateness = arrived - due[message.body]
            assert -EARLY <= lateness <= LATE, (message.body, lateness)
        ladder_backend.wait_until(lambda: sched.delivered == 2, 10, "the deliveries' confirms")
        # 12 s: 10 s rung, then held 2 s by the relay and delivered; 2 s: 1 s rung, held 1 s, delivered
        assert sched.hops == 0


APP_HEADERS = {
    "app-str": "value",
    "app-int": 42,
    "app-neg": -7,
    "app-bool": True,
    "app-list": [1, "two"],
    "app-table": {"k": "v"},
    "x-custom": "kept",
    "x-deathly": "kept too",
}


@pytest.mark.parametrize("delivery_mode", [1, 2])
def test_delivery_fidelity(ladder_backend: Any, delivery_mode: int) -> None:
    body = b"\x00\x01 raw bytes \xff\xfe"
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.fidelity", exchange="t.fidelity.x", routing_key="rk.fid")
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish(
            body, exchange="t.fidelity.x", routing_key="rk.fid", countdown=2.5,
            content_type="application/x-custom", content_encoding="binary",
            headers=dict(APP_HEADERS), correlation_id="corr-42", reply_to="reply.queue",
            message_id="msg-42", priority=5, delivery_mode=delivery_mode,
        )
        arrivals = Arrivals(ladder_backend, conn, "t.fidelity")
        [message] = [m for _, _, m in arrivals.wait(1, timeout=20)]
        ladder_backend.wait_until(lambda: sched.delivered == 1, 10, "the delivery's confirm")
        assert sched.hops == 0  # 2.5 s: 1 s rung, then held 1.5 s by the relay and delivered
    assert message.body == body
    assert message.content_type == "application/x-custom"
    assert message.content_encoding == "binary"
    assert message.headers == APP_HEADERS  # and so no x-schedule-*, x-death, x-first-death-*, x-last-death-*
    props = message.properties
    assert props["correlation_id"] == "corr-42"
    assert props["reply_to"] == "reply.queue"
    assert props["message_id"] == "msg-42"
    assert props["priority"] == 5
    assert props["delivery_mode"] == delivery_mode
    assert props.get("type") != "ScheduledMessage"
    assert props.get("expiration") is None
    assert message.delivery_info["exchange"] == "t.fidelity.x"
    assert message.delivery_info["routing_key"] == "rk.fid"


def parked(conn: Any) -> list[Any]:
    out = []
    while (message := get(conn, "acemq.schedule.parked")) is not None:
        out.append(message)
    return out


@pytest.mark.parametrize("payload", [b"lost", {"lost": "json"}], ids=["bytes", "json"])
@pytest.mark.parametrize("target", ["default-exchange", "unbound-exchange"])
def test_unroutable_delivery_is_parked_with_the_reason(ladder_backend: Any, target: str, payload: Any) -> None:
    missing = f"t.nowhere.{uuid.uuid4().hex[:8]}"
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.ok")
        exchange = ""
        if target == "unbound-exchange":
            exchange = "t.unbound.x"
            Exchange(exchange, type="direct", durable=True).bind(conn.default_channel).declare()
        sched.in_(1.2, payload, routing_key=missing, exchange=exchange, headers={"app": "h"},
                  correlation_id="corr-lost")
        sched.in_(1.2, b"fine", routing_key="t.ok")
        ladder_backend.wait_until(lambda: sched.parked == 1 and sched.delivered == 1, 20,
                                  "one parked and one delivered")
        [message] = parked(conn)
        assert message.decode() == payload
        reason = message.headers["x-ladder-parked-reason"]
        assert reason.startswith("unroutable:")
        assert "NO_ROUTE" in reason and missing in reason
        assert isinstance(message.headers["x-ladder-parked-at"], int)
        assert message.headers["app"] == "h"
        assert message.headers["x-schedule-routing-key"] == missing  # kept, so it can be re-sent
        assert "x-death" not in message.headers
        assert message.properties["correlation_id"] == "corr-lost"
        assert get(conn, "t.ok").body == b"fine"
        assert (sched.delivered, sched.malformed) == (1, 0)
    # Every expired message was acked: nothing comes back to the control queue once the relay is gone.
    with ladder_backend.connection() as conn:
        assert depth(conn, "acemq.schedule.due") == 0


def test_delivery_to_a_missing_exchange_is_parked(ladder_backend: Any) -> None:
    missing = f"t.no-such-exchange.{uuid.uuid4().hex[:8]}"
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.after")
        sched.in_(1.2, b"lost", routing_key="k", exchange=missing)
        sched.in_(1.2, b"fine", routing_key="t.after")
        ladder_backend.wait_until(lambda: sched.parked == 1 and sched.delivered == 1, 20,
                                  "one parked and one delivered")
        [message] = parked(conn)
        assert message.body == b"lost"
        assert missing in message.headers["x-ladder-parked-reason"]
        assert [m.body for m in [get(conn, "t.after")]] == [b"fine"]
        assert get(conn, "t.after") is None  # delivered once, not again after a channel error
        assert sched.running
    with ladder_backend.connection() as conn:
        assert depth(conn, "acemq.schedule.due") == 0


MALFORMED: list[tuple[str, Any]] = [
    ("no headers", None),
    ("missing due-at", {"x-schedule-exchange": "", "x-schedule-routing-key": "t.ok"}),
    ("due-at abc", {"x-schedule-exchange": "", "x-schedule-routing-key": "t.ok", "x-schedule-due-at": "abc"}),
    ("due-at True", {"x-schedule-exchange": "", "x-schedule-routing-key": "t.ok", "x-schedule-due-at": True}),
    ("due-at float string", {"x-schedule-exchange": "", "x-schedule-routing-key": "t.ok",
                             "x-schedule-due-at": "1700000000000.5"}),
    ("missing target", {"x-schedule-due-at": 1_700_000_000_000}),
]


def test_malformed_messages_are_parked_counted_and_the_relay_keeps_running(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.ok")
        producer = Producer(conn.default_channel)
        for label, headers in MALFORMED:
            producer.publish(label.encode(), exchange="", routing_key="acemq.schedule.due", headers=headers,
                             content_type="text/plain", content_encoding="utf-8")
        ladder_backend.wait_until(lambda: sched.parked == len(MALFORMED), 20, "every malformed message parked")
        assert sched.malformed == len(MALFORMED)
        assert sched.delivered == 0
        messages = {(m.body if isinstance(m.body, str) else m.body.decode()): m for m in parked(conn)}
        assert sorted(messages) == sorted(label for label, _ in MALFORMED)
        for label, message in messages.items():
            assert message.headers["x-ladder-parked-reason"].startswith("malformed:"), label
            assert message.content_type == "text/plain"
        assert "x-schedule-due-at" in messages["due-at abc"].headers["x-ladder-parked-reason"]
        assert "no headers" in messages["no headers"].headers["x-ladder-parked-reason"]
        assert "x-schedule-exchange" in messages["missing target"].headers["x-ladder-parked-reason"]
        # Still relaying.
        sched.in_(1.2, b"after", routing_key="t.ok")
        message = ladder_backend.wait_until(lambda: get(conn, "t.ok"), 20, "a delivery after the malformed ones")
        assert message.body == b"after"
        ladder_backend.wait_until(lambda: sched.delivered == 1, 10, "the delivery's confirm")
        assert sched.running and sched.malformed == len(MALFORMED)
    with ladder_backend.connection() as conn:
        assert depth(conn, "acemq.schedule.due") == 0


def test_a_burst_of_returns_among_deliveries_settles_each_exactly_once(ladder_backend: Any) -> None:
    """Returns, deliveries and parks interleave in one prefetch window; each expiry is acked once."""
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.burst")
        for n in range(30):
            routable = n % 3 != 0
            sched.in_(1.2, f"m{n}".encode(), routing_key="t.burst" if routable else "t.burst.nowhere")
        ladder_backend.wait_until(lambda: sched.delivered == 20 and sched.parked == 10, 30,
                                  "20 delivered and 10 parked")
        arrivals = Arrivals(ladder_backend, conn, "t.burst")
        arrivals.poll()
        delivered = sorted(m.body for m in arrivals.messages)
        assert delivered == sorted(f"m{n}".encode() for n in range(30) if n % 3 != 0)
        assert sorted(m.body for m in parked(conn)) == sorted(f"m{n}".encode() for n in range(0, 30, 3))
        assert (sched.hops, sched.malformed) == (0, 0)
    with ladder_backend.connection() as conn:
        assert depth(conn, "acemq.schedule.due") == 0
        assert get(conn, "t.burst") is None


def test_a_compressed_message_is_delivered_decodable(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock):
        declare_target(conn, "t.zlib")
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish({"big": "x" * 5000}, routing_key="t.zlib", countdown=1.2, compression="zlib")
        [message] = [m for _, _, m in Arrivals(ladder_backend, conn, "t.zlib").wait(1, timeout=20)]
        assert message.headers == {"compression": "application/x-gzip"}
        assert message.decode() == {"big": "x" * 5000}


def test_a_hop_into_a_deleted_rung_is_parked_not_lost(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        channel = conn.channel()
        channel.queue_delete(queue="acemq.schedule.10s")  # an operator's mistake, while the relay runs
        channel.close()
        due = int(ladder_backend.clock() * 1000) + 15000  # beyond the hold window: a hop into 10 s
        Producer(conn.default_channel).publish(
            b"hop", exchange="", routing_key="acemq.schedule.due",
            headers={"x-schedule-exchange": "", "x-schedule-routing-key": "t.hop",
                     "x-schedule-due-at": due, "x-schedule-content-type": "text/plain"},
        )
        ladder_backend.wait_until(lambda: sched.parked == 1, 20, "the returned hop parked")
        [message] = parked(conn)
        assert message.body == b"hop"
        assert message.headers["x-ladder-parked-reason"].startswith("unroutable:")
        assert "acemq.schedule.10s" in message.headers["x-ladder-parked-reason"]
        assert message.headers["x-schedule-due-at"] == due  # kept, so it can be replayed
        assert (sched.hops, sched.delivered, sched.malformed) == (0, 0, 0)
    with ladder_backend.connection() as conn:
        assert depth(conn, "acemq.schedule.due") == 0
