"""The simulator's RabbitMQ profiles: 4.3 refuses what 4.3 refuses (4.0 and 3.10 accept it); the ladder declares
nothing any of them refuses."""

from __future__ import annotations

from typing import Any

import pytest
from amqp.exceptions import InternalError, PreconditionFailed
from kombu import Consumer, Queue

from kombu_ladder import Relay, Scheduler, declare
from kombu_ladder.simulator import SimulatedBroker
from kombu_ladder.simulator.profiles import PROFILES, profile_for


@pytest.fixture(params=sorted(PROFILES))
def broker(request: pytest.FixtureRequest) -> Any:
    simulated = SimulatedBroker(rabbitmq=request.param)
    yield simulated
    simulated.close()


REFUSED_BY_43 = [
    ("x-queue-mode lazy", dict(durable=True, queue_arguments={"x-queue-mode": "lazy"}), PreconditionFailed,
     "x-queue-mode"),
    ("x-queue-mode default", dict(durable=True, queue_arguments={"x-queue-mode": "default"}), PreconditionFailed,
     "x-queue-mode"),
    ("x-queue-version 1", dict(durable=True, queue_arguments={"x-queue-version": 1}), PreconditionFailed,
     "unsupported queue version '1'"),
    ("transient non-exclusive", dict(durable=False, auto_delete=True), InternalError, "transient_nonexcl_queues"),
]


@pytest.mark.parametrize("label,kwargs,error,text", REFUSED_BY_43, ids=[r[0] for r in REFUSED_BY_43])
def test_43_refuses_what_310_accepts(broker: SimulatedBroker, label: str, kwargs: dict[str, Any], error: type,
                                     text: str) -> None:
    with broker.connection() as conn:
        queue = Queue(f"q.{label.replace(' ', '-')}", **kwargs)
        if broker.profile.name in ("3.10", "4.0"):  # 4.0 accepts all four (measured on 4.0.5)
            queue(conn.channel()).declare()
            assert f"q.{label.replace(' ', '-')}" in broker.queue_names()
        else:
            with pytest.raises(error, match=text):
                queue(conn.channel()).declare()
            assert broker.queue_names() == []


@pytest.mark.parametrize("kwargs", [dict(durable=True, queue_arguments={"x-queue-version": 2}),
                                    dict(durable=False, exclusive=True), dict(durable=True, auto_delete=True)])
def test_43_accepts_durable_queues_cqv2_and_transient_exclusive_ones(kwargs: dict[str, Any]) -> None:
    broker = SimulatedBroker(rabbitmq="4.3")
    try:
        with broker.connection() as conn:
            Queue("q.ok", **kwargs)(conn.channel()).declare()
            assert broker.queue_names() == ["q.ok"]
    finally:
        broker.close()


def _held(broker: SimulatedBroker, conn: Any, *, apply_global: bool) -> dict[str, int]:
    """Two consumers on one channel after ``basic.qos(prefetch_count=1, global=apply_global)``."""
    channel = conn.channel()
    for name in ("q.a", "q.b"):
        Queue(name, durable=True)(channel).declare()
        for n in range(3):
            conn.default_channel.basic_publish(conn.default_channel.prepare_message(b"%d" % n), "", name)
    channel.basic_qos(0, 1, apply_global)
    held = {"q.a": 0, "q.b": 0}

    def hold(message: Any) -> None:
        held[message.delivery_info["routing_key"]] += 1

    Consumer(channel, [Queue("q.a", no_declare=True), Queue("q.b", no_declare=True)], on_message=hold).consume()
    broker.advance(0)
    conn.drain_events(timeout=0.1)
    while True:
        try:
            conn.drain_events(timeout=0.05)
        except Exception:  # noqa: BLE001 - socket.timeout: nothing more arrives
            return held


def test_global_qos_limits_the_channel_on_310_and_each_consumer_on_43(broker: SimulatedBroker) -> None:
    with broker.connection() as conn:
        held = _held(broker, conn, apply_global=True)
    if broker.profile.name in ("3.10", "4.0"):
        assert sum(held.values()) == 1, held  # one unacked message on the whole channel
    else:
        assert held == {"q.a": 1, "q.b": 1}  # quietly per consumer


def test_the_ladder_declares_and_relays_under_every_profile(broker: SimulatedBroker) -> None:
    with broker.connection() as conn:
        names = declare(conn)
        Queue("t.done", durable=True)(conn.channel()).declare()
        with Scheduler.on(conn, relay=False, clock=broker.now) as sched:
            sched.in_(75, b"later", routing_key="t.done")
        broker.host(Relay())
        broker.advance(76)
        assert [m.body for m in broker.take("t.done")] == [b"later"]
    assert len(names) == 6


def test_an_unknown_profile_is_refused_naming_the_argument() -> None:
    with pytest.raises(ValueError, match=r"rabbitmq='4\.2' is not a simulator profile"):
        profile_for("4.2")
