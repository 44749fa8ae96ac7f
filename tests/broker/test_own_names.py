"""Issue 28: the ladder's own names are never a delivery target, on RabbitMQ and the simulator."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from backends import Arrivals, declare_target, depth
from kombu import Producer

from kombu_ladder import LadderProducer, Scheduler
from kombu_ladder.cancellation.records import STREAM, encode
from kombu_ladder.contract import CONTENT_TYPE, CONTROL, DUE_AT, EXCHANGE, PARKING, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from kombu_ladder.parking import parked_reasons
from kombu_ladder.targets import own_name_problem

#: (exchange, routing key) pairs that reach the ladder itself, and which argument is at fault.
OWN_TARGETS = [
    ("", STREAM, "routing_key"),                    # a cancellation record written with the relay's rights
    ("", CONTROL, "routing_key"),                   # straight back into the control queue
    ("", PARKING, "routing_key"),
    ("", "acemq.schedule.1s", "routing_key"),
    ("", "acemq.schedule.some-queue-of-ours", "routing_key"),
    ("", EXCHANGE, "routing_key"),
    (EXCHANGE, CONTROL, "exchange"),
    (EXCHANGE, "acemq.schedule.1h", "exchange"),
    (STREAM, "", "exchange"),                       # the cancellation exchange
    (STREAM, STREAM, "exchange"),
]


@pytest.mark.parametrize("exchange,routing_key,argument", OWN_TARGETS)
def test_the_ladders_own_names_are_no_target(exchange: str, routing_key: str, argument: str) -> None:
    found = own_name_problem(exchange, routing_key)
    assert found is not None and found[0] == argument
    assert "the ladder's own" in found[1]


@pytest.mark.parametrize("exchange,routing_key", [
    ("", "celery"), ("", "acemq.schedulex"), ("", "ladder.cancellations.archive"), ("billing", STREAM),
    ("billing", CONTROL), ("acemq.schedule.x", "k"), ("amq.direct", STREAM),
])
def test_other_names_are_targets(exchange: str, routing_key: str) -> None:
    assert own_name_problem(exchange, routing_key) is None


def _forge(producer: Any, body: bytes, exchange: str, routing_key: str, due_ms: int) -> None:
    """What anyone who may publish into the ladder can send: an expiry for any target."""
    producer.publish(body, exchange="", routing_key=CONTROL, content_type="application/json",
                     content_encoding="utf-8", headers={TARGET_EXCHANGE: exchange, TARGET_ROUTING_KEY: routing_key,
                                                        DUE_AT: due_ms, CONTENT_TYPE: "application/json"})


def test_a_message_for_the_ladders_own_names_is_parked_refused_and_cancels_nothing(ladder_backend: Any) -> None:
    """A forged cancellation record scheduled for the stream is parked; the message it names is delivered."""
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.victim")
        victim = sched.in_(3.0, b"victim", routing_key="t.victim")
        now_ms = int(ladder_backend.clock() * 1000)
        forged = encode(victim, at=now_ms)
        producer = Producer(conn.default_channel)
        for exchange, routing_key, _ in OWN_TARGETS:
            _forge(producer, forged, exchange, routing_key, now_ms - 1000)
        ladder_backend.wait_until(lambda: sched.parked == len(OWN_TARGETS), 20, "every forged message parked")
        (_, _, message), = Arrivals(ladder_backend, conn, "t.victim").wait(1, 20)
        assert message.properties["message_id"] == victim
        # The relay counts a delivery once the broker confirmed it, which may come after the message arrived.
        ladder_backend.wait_until(lambda: sched.delivered, 20, "the delivery counted")
        assert (sched.cancelled, sched.delivered) == (0, 1)
        reasons = dict(parked_reasons(conn))
        assert sum(reasons.values()) == len(OWN_TARGETS)
        assert all(r.startswith("refused: target ") and "the ladder's own" in r for r in reasons), reasons
        assert depth(conn, CONTROL) == 0


@pytest.mark.parametrize("exchange,routing_key,argument", OWN_TARGETS)
@pytest.mark.parametrize("countdown", [0.2, 30])  # straight to the target, and into a rung
def test_the_producer_refuses_the_ladders_own_names_naming_the_argument(ladder_backend: Any, exchange: str,
                                                                        routing_key: str, argument: str,
                                                                        countdown: float) -> None:
    with ladder_backend.connection() as conn:
        ladder = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        with pytest.raises(ValueError, match=rf"^{argument}: the target .* the ladder's own"):
            ladder.publish(b"x", exchange=exchange, routing_key=routing_key, countdown=countdown)


def test_the_celery_hook_refuses_a_task_for_the_ladders_own_queue(ladder_celery: Any) -> None:
    from celery import shared_task

    @shared_task(name="own.names")
    def task(n: Optional[int] = None) -> None:
        """Never runs."""

    with pytest.raises(ValueError, match=r"routing_key: the target routing key 'ladder\.cancellations'"):
        task.apply_async((1,), countdown=60, queue=STREAM)  # Celery sends it to "" with the queue's name
    assert ladder_celery.delivered() == []
