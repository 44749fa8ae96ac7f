"""The ladder on the simulator: long delays in milliseconds, hop counts, and the head-of-line bug it avoids."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

from kombu_ladder import LadderProducer, Relay, Scheduler, TopologyConflict, declare, hops_for
from kombu_ladder.contract import rung_name
from kombu_ladder.plan import HOLD_WINDOW
from kombu_ladder.plan import forecast as timing_forecast
from kombu_ladder.simulator import SimulatedBroker

HOUR = 3600
DAY = 24 * HOUR


def _target(conn: Any, name: str = "t.sim") -> None:
    billing = Exchange("billing", "direct", durable=True)
    Queue(name, billing, routing_key=name, durable=True)(conn.default_channel).declare()


def _rung_arrivals(broker: SimulatedBroker) -> Counter[int]:
    return Counter({r: len(broker.arrivals(rung_name(r))) for r in (3600, 600, 60, 10, 1)
                    if broker.arrivals(rung_name(r))})


@pytest.mark.parametrize("delay", [HOUR, 4 * HOUR, DAY, 30 * DAY, 90, 3 * HOUR + 25 * 60 + 7])
def test_a_long_delay_takes_exactly_the_forecast_hops_in_milliseconds(delay: int) -> None:
    broker = SimulatedBroker(start=1_800_000_000)
    relay = broker.host(Relay())
    started = time.perf_counter()
    with broker.connection() as conn:
        _target(conn)
        LadderProducer(conn.default_channel, clock=broker.now).publish(
            {"delay": delay}, exchange="billing", routing_key="t.sim", countdown=delay)
        broker.advance(delay - 0.001)
        assert broker.messages("t.sim") == []
        broker.advance(0.001)
        (arrival,) = broker.arrivals("t.sim")
    elapsed = time.perf_counter() - started
    # the relay holds the last residual (below the hold window) instead of taking 1 s hops
    forecast, _ = timing_forecast(delay * 1000, hold_window_ms=round(HOLD_WINDOW * 1000))
    assert set(forecast) <= set(hops_for(delay)) and len(forecast) <= len(hops_for(delay))
    assert arrival.at == 1_800_000_000 + delay
    assert arrival.message.payload == {"delay": delay}
    assert _rung_arrivals(broker) == Counter(forecast)
    assert relay.counters.as_dict() == {"received": len(forecast), "delivered": 1, "hops": len(forecast) - 1,
                                        "malformed": 0, "parked": 0, "refused": 0, "cancelled": 0}
    assert elapsed < 10, f"{delay}s of virtual time took {elapsed:.2f}s of real time"


@pytest.mark.parametrize("delay", [120, HOUR, 4 * HOUR, DAY, 90, 75])
def test_with_a_3ms_expiry_lag_round_delays_take_their_theoretical_placements_and_arrive_on_time(
        delay: int) -> None:
    lag_ms = 3
    broker = SimulatedBroker(start=1_800_000_000, expiry_lag=lag_ms / 1000)
    relay = broker.host(Relay())
    with broker.connection() as conn:
        _target(conn)
        LadderProducer(conn.default_channel, clock=broker.now).publish(
            b"x", exchange="billing", routing_key="t.sim", countdown=delay)
        broker.advance(delay + 1)
    rungs, late_ms = timing_forecast(delay * 1000, lag_ms=lag_ms, hold_window_ms=round(HOLD_WINDOW * 1000))
    (arrival,) = broker.arrivals("t.sim")
    lateness_ms = round((arrival.at - 1_800_000_000 - delay) * 1000)
    assert lateness_ms == late_ms
    assert len(rungs) <= len(hops_for(delay)) + 1  # fewer when held instead of 1 s hops (90 s, 75 s)
    assert delay % 60 or abs(len(rungs) - len(hops_for(delay))) <= 1
    assert _rung_arrivals(broker) == Counter(rungs)
    assert relay.counters.hops == len(rungs) - 1
    # Every hop loses the lag: 24 one-hour hops arrive 72 ms late (the bound, see docs/how.rst).
    assert -5 <= lateness_ms <= (50 if delay < DAY else 24 * lag_ms)


def test_with_a_lag_beyond_the_tolerance_the_ladder_steps_down_and_holds_to_the_due_time() -> None:
    broker = SimulatedBroker(start=1_800_000_000, expiry_lag=0.006)
    broker.host(Relay())
    with broker.connection() as conn:
        _target(conn)
        LadderProducer(conn.default_channel, clock=broker.now).publish(
            b"x", exchange="billing", routing_key="t.sim", countdown=DAY)
        broker.advance(DAY + 1)
    (arrival,) = broker.arrivals("t.sim")
    assert arrival.at == 1_800_000_000 + DAY
    assert len(broker.arrivals(rung_name(1))) == 0


def test_per_message_ttl_head_of_line_bug_and_the_ladder_avoiding_it() -> None:
    broker = SimulatedBroker(start=1_800_000_000)
    broker.host(Relay())
    with broker.connection() as conn:
        channel = conn.default_channel
        Queue("hol.target", durable=True)(channel).declare()
        Queue("hol.waiting", durable=True, queue_arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "hol.target"})(channel).declare()
        Queue("ladder.target", durable=True)(channel).declare()
        plain = Producer(channel)
        plain.publish(b"4h", routing_key="hol.waiting", expiration=4 * HOUR)
        plain.publish(b"1min", routing_key="hol.waiting", expiration=60)
        ladder = LadderProducer(channel, clock=broker.now)
        ladder.publish(b"4h", routing_key="ladder.target", countdown=4 * HOUR)
        ladder.publish(b"1min", routing_key="ladder.target", countdown=60)

        broker.advance(60)
        assert broker.messages("hol.target") == []  # the 1 min message is stuck behind the 4 h one
        assert [a.message.body for a in broker.arrivals("ladder.target")] == [b"1min"]

        broker.advance(4 * HOUR - 60)
    hol = [(a.at - 1_800_000_000, a.message.body) for a in broker.arrivals("hol.target")]
    assert hol == [(4 * HOUR, b"4h"), (4 * HOUR, b"1min")]
    ladder_arrivals = [(a.at - 1_800_000_000, a.message.body) for a in broker.arrivals("ladder.target")]
    assert ladder_arrivals == [(60, b"1min"), (4 * HOUR, b"4h")]


def test_a_task_scheduled_a_day_ahead_runs_in_well_under_a_second(ladder_broker: SimulatedBroker) -> None:
    ran: list[dict[str, Any]] = []

    def send_reminder(payload: dict[str, Any]) -> None:  # the user's code under test
        ran.append(payload)

    started = time.perf_counter()
    with ladder_broker.connection() as conn:
        reminders = Queue("reminders", durable=True)
        reminders(conn.default_channel).declare()
        with Scheduler.on(conn, relay=False, clock=ladder_broker.now) as scheduler:
            scheduler.in_(DAY, {"user": 7, "text": "renew"}, routing_key="reminders")
        ladder_broker.advance(DAY - 1)
        assert ladder_broker.depth("reminders") == 0
        ladder_broker.advance(1)
        with Consumer(conn, [reminders], callbacks=[lambda body, message: (send_reminder(body), message.ack())],
                      accept=["json"]):
            conn.drain_events(timeout=1)
    assert ran == [{"user": 7, "text": "renew"}]
    assert time.perf_counter() - started < 1.0


def test_a_scheduler_with_its_own_relay_thread_runs_on_the_virtual_clock() -> None:
    broker = SimulatedBroker()
    with broker.connection() as conn:
        Queue("t.thread", durable=True)(conn.default_channel).declare()
        scheduler = Scheduler.on(conn, clock=broker.now)
        start = broker.now()
        scheduler.in_(4 * HOUR, b"later", routing_key="t.thread")
        scheduler.in_(90, b"soon", routing_key="t.thread")
        broker.advance(4 * HOUR)
        assert (scheduler.delivered, scheduler.hops) == (2, 3 + 3)
        started = time.perf_counter()
        scheduler.close()
        assert time.perf_counter() - started < 5  # the relay thread stops without waiting out a poll
        assert not scheduler.running
    assert [(round(a.at - start), a.message.body) for a in broker.arrivals("t.thread")] == \
        [(90, b"soon"), (4 * HOUR, b"later")]


def test_declaring_the_ladder_over_a_conflicting_queue_fails_as_on_rabbitmq() -> None:
    broker = SimulatedBroker()
    with broker.connection() as conn:
        Queue(rung_name(3600), durable=True, queue_arguments={"x-message-ttl": 1000})(conn.default_channel).declare()
        with pytest.raises(TopologyConflict, match="inequivalent arg 'x-message-ttl'"):
            declare(conn)
        assert conn.default_channel.queue_declare(queue=rung_name(3600), passive=True).queue == rung_name(3600)


def test_two_brokers_in_one_process_are_independent() -> None:
    first, second = SimulatedBroker(), SimulatedBroker(start=0)
    with first.connection() as a, second.connection() as b:
        Queue("only.first")(a.default_channel).declare()
        assert "only.first" in first.queue_names() and "only.first" not in second.queue_names()
        assert b.default_channel.queue_declare(queue="", exclusive=True).queue.startswith("amq.gen-")
    first.advance(10)
    assert second.now() < 1 and first.now() > 1_000_000_000


def test_a_scheduler_on_a_simulator_connection_takes_the_virtual_clock_unasked() -> None:
    broker = SimulatedBroker(start=1_800_000_000)  # years from the wall clock: a wall-clock stamp would show
    with broker.connection() as conn:
        Queue("t.clock", durable=True)(conn.default_channel).declare()
        with Scheduler.on(conn) as scheduler:
            assert scheduler.clock() == broker.now()
            scheduler.in_(90, b"soon", routing_key="t.clock")
            broker.advance(89)
            assert broker.arrivals("t.clock") == []
            broker.advance(2)
            wait = time.monotonic() + 10
            while not broker.arrivals("t.clock") and time.monotonic() < wait:
                broker.settle()
    assert [(round(a.at - 1_800_000_000), a.message.body) for a in broker.arrivals("t.clock")] == [(90, b"soon")]


def test_a_producer_and_a_relay_on_a_simulator_connection_take_its_clock_unless_given_one() -> None:
    from kombu_ladder.relay import Relay

    broker = SimulatedBroker(start=1_800_000_000)
    with broker.connection() as conn:
        assert LadderProducer(conn.default_channel).clock() == broker.now()
        assert LadderProducer(conn.default_channel, clock=lambda: 5.0).clock() == 5.0
        assert Relay(conn).core.clock() == broker.now()
    with Connection("amqp://guest:guest@127.0.0.1:1//") as amqp:
        assert Relay(amqp).core.clock is time.time  # no I/O: the transport is only looked at


def test_a_simulator_url_alone_reaches_one_broker_made_on_first_use() -> None:
    from kombu_ladder.simulator.registry import unique_name

    name = unique_name() + "-by-url"
    with Connection(f"ladder-sim://{name}") as first:
        Queue("t.url")(first.default_channel).declare()
        broker = SimulatedBroker.named(name)
        assert first.transport.broker is broker and "t.url" in broker.queue_names()
    with Connection(f"ladder-sim://localhost/{name}") as again:
        assert again.default_channel.queue_declare(queue="t.url", passive=True).queue == "t.url"
    assert SimulatedBroker.named(name) is broker
