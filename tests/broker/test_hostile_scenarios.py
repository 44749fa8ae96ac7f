"""Hostile situations around the relay, on RabbitMQ and the simulator: survived without loss or duplicate.

Parking into a deleted parking queue, parking that cannot succeed, an exchange deleted
inside the exchange check's trust window, an internal exchange no check reveals,
identical messages in flight together, a storm to one missing exchange.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Iterator

import hostile_corpus as corpus
import pytest
from amqp import spec
from amqp.exceptions import PreconditionFailed
from backends import SimulatorBackend
from helpers import depth_on, purge
from kombu import Connection

from kombu_ladder import LadderProducer, Relay, declare
from kombu_ladder.contract import CONTROL, PARKING
from kombu_ladder.relay import RelayCore

#: Valid messages around each hostile one.
AROUND = 10


def bodies(channel: Any, queue: str) -> Counter[bytes]:
    return Counter(body for _, body in corpus.take_raw(channel, queue))


def due(backend: Any) -> int:
    return int(backend.clock() * 1000)


def to(exchange: str, body: bytes, now_ms: int, routing_key: str = "k") -> corpus.Case:
    return corpus.Case(body.decode(), corpus.properties(corpus.schedule(now_ms, exchange=exchange,
                                                                         routing_key=routing_key), delivery_mode=2),
                       body, "park")


def held(runner: Any) -> list[Any]:
    """The jobs the relay has not finished (read from the test's thread: retried if they change meanwhile)."""
    for _ in range(100):
        try:
            return list(runner.core.publisher.pending.waiting())
        except RuntimeError:  # mutated while we looked
            continue
    raise AssertionError("the relay's jobs kept changing")


@pytest.fixture
def relay(ladder_backend: Any) -> Iterator[tuple[Any, Any, Any]]:
    """The ladder and the corpus's targets declared, a relay running: (backend, relay, raw channel).

    On RabbitMQ the standalone relay in a thread; on the simulator its relay, which
    ``advance`` drives (and ticks) in virtual time, so back-offs run on that clock.
    """
    with ladder_backend.connection() as conn:
        channel = conn.channel()
        declare(channel)
        purge(conn, *corpus.TARGET_QUEUES, "hostile.gone.q", PARKING)
        corpus.declare_targets(channel)
        if ladder_backend.name == "simulator":
            yield ladder_backend, ladder_backend.broker.host(Relay()), channel
            return
        relay = Relay(conn.clone(), clock=ladder_backend.clock)
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        assert relay.ready.wait(20)
        try:
            yield ladder_backend, relay, channel
        finally:
            relay.stop()
            thread.join(15)
            relay.connection.release()


def test_parks_into_a_deleted_parking_queue_declare_it_again_and_lose_nothing(relay: Any) -> None:
    backend, runner, channel = relay
    channel.queue_delete(queue=PARKING)
    now = due(backend)
    for n in range(7):
        corpus.publish(channel, corpus.Case("x", corpus.properties(None), b"malformed %d" % n, "park"))
        corpus.publish(channel, corpus.valid(n, now))
    backend.wait_until(lambda: runner.counters.parked == 7 and runner.counters.delivered == 7, 30,
                       "7 parked, 7 delivered")
    assert sorted(bodies(channel, PARKING)) == [b"malformed %d" % n for n in range(7)]
    assert bodies(channel, corpus.VALID_QUEUE) == Counter(b"valid-%d" % n for n in range(7))
    assert depth_on(channel, CONTROL) == 0 and runner.core.outstanding == 0


def test_a_park_the_broker_refuses_is_not_acked_and_succeeds_once_parking_works_again(relay: Any) -> None:
    backend, runner, channel = relay
    channel.queue_delete(queue=PARKING)
    channel.queue_declare(queue=PARKING, durable=True, auto_delete=False,
                          arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    now = due(backend)
    corpus.publish(channel, corpus.Case("x", corpus.properties(None), b"unparkable for now", "park"))
    corpus.publish(channel, corpus.valid(0, now))
    backend.wait_until(lambda: runner.counters.delivered == 1 and held(runner), 20,
                       "the valid one delivered, the malformed one held")
    backend.wait_until(lambda: held(runner)[0].attempts >= 2, 20, "the nacked park backing off")
    [job] = held(runner)
    assert job.body == b"unparkable for now" and runner.counters.parked == 0
    channel.queue_delete(queue=PARKING)  # the operator repairs the parking queue
    declare(channel)
    backend.wait_until(lambda: runner.counters.parked == 1 and not runner.core.publisher.pending.jobs, 30,
                       "the park tried again after its back-off")
    assert bodies(channel, PARKING) == Counter([b"unparkable for now"])
    assert depth_on(channel, CONTROL) == 0


def test_an_exchange_deleted_inside_the_trust_window_parks_its_message_and_duplicates_nothing(relay: Any) -> None:
    backend, runner, channel = relay
    channel.exchange_declare("hostile.gone", "fanout", durable=True, auto_delete=False)
    channel.queue_declare(queue="hostile.gone.q", durable=True, auto_delete=False)
    channel.queue_bind("hostile.gone.q", "hostile.gone", "")
    corpus.publish(channel, to("hostile.gone", b"while it existed", due(backend)))
    backend.wait_until(lambda: depth_on(channel, "hostile.gone.q") == 1, 20, "a delivery: the exchange is trusted now")
    channel.exchange_delete("hostile.gone")
    now = due(backend)
    for n in range(AROUND):
        corpus.publish(channel, corpus.valid(n, now))
    corpus.publish(channel, to("hostile.gone", b"after it was deleted", now))
    for n in range(AROUND, 2 * AROUND):
        corpus.publish(channel, corpus.valid(n, now))
    backend.wait_until(lambda: runner.counters.delivered == 1 + 2 * AROUND and runner.counters.parked == 1, 30,
                       "the neighbours delivered and the orphan parked")
    assert bodies(channel, corpus.VALID_QUEUE) == Counter(b"valid-%d" % n for n in range(2 * AROUND))
    [(raw, body)] = corpus.take_raw(channel, PARKING)
    assert body == b"after it was deleted"
    assert "NOT_FOUND" in corpus.decoded(raw)["application_headers"]["x-ladder-parked-reason"]
    assert depth_on(channel, CONTROL) == 0 and runner.core.outstanding == 0


def test_an_internal_exchange_no_check_reveals_closes_one_channel_and_nothing_else(relay: Any) -> None:
    """A user-declared internal exchange passes both checks; the publish closes the relay's
    publishing channel. The culprit is parked, its neighbours delivered exactly once."""
    backend, runner, channel = relay
    if backend.name == "rabbitmq":  # py-amqp's exchange_declare has no ``internal``
        channel.send_method(spec.Exchange.Declare, "BssbbbbbF",
                            (0, "hostile.internal", "fanout", False, True, False, True, False, {}),
                            wait=spec.Exchange.DeclareOk)
    else:
        channel.exchange_declare("hostile.internal", "fanout", durable=True, auto_delete=False, internal=True)
    now = due(backend)
    for n in range(AROUND):
        corpus.publish(channel, corpus.valid(n, now))
    corpus.publish(channel, to("hostile.internal", b"to an internal exchange", now))
    corpus.publish(channel, to("hostile.internal", b"again", now))
    for n in range(AROUND, 2 * AROUND):
        corpus.publish(channel, corpus.valid(n, now))
    backend.wait_until(lambda: runner.counters.delivered == 2 * AROUND and runner.counters.parked == 2, 30,
                       "the neighbours delivered and both culprits parked")
    assert bodies(channel, corpus.VALID_QUEUE) == Counter(b"valid-%d" % n for n in range(2 * AROUND))
    reasons = [corpus.decoded(r)["application_headers"]["x-ladder-parked-reason"]
               for r, _ in corpus.take_raw(channel, PARKING)]
    assert len(reasons) == 2 and all("internal exchange" in r for r in reasons), reasons
    assert depth_on(channel, CONTROL) == 0 and runner.core.outstanding == 0


def test_identical_messages_in_flight_together_are_each_delivered_or_parked_once(relay: Any) -> None:
    """Same bytes, same target: a return cannot tell them apart, so they are never in flight together."""
    backend, runner, channel = relay
    now = due(backend)
    twin = corpus.Case("twin", corpus.properties(corpus.schedule(now), delivery_mode=2), b"twin", "")
    lost = corpus.Case("lost", corpus.properties(corpus.schedule(now, routing_key="hostile.nowhere"),
                                                 delivery_mode=2), b"lost", "")
    for _ in range(5):
        corpus.publish(channel, twin)
        corpus.publish(channel, lost)
    backend.wait_until(lambda: runner.counters.delivered == 5 and runner.counters.parked == 5, 30,
                       "5 twins delivered and 5 parked")
    assert bodies(channel, corpus.VALID_QUEUE) == Counter({b"twin": 5})
    assert bodies(channel, PARKING) == Counter({b"lost": 5})
    assert runner.core.outstanding == 0


def test_a_storm_to_one_missing_exchange_asks_the_broker_a_handful_of_times(relay: Any) -> None:
    backend, runner, channel = relay
    now = due(backend)
    for n in range(1000):
        corpus.publish(channel, to("hostile.missing.storm", b"storm %d" % n, now))
    backend.wait_until(lambda: runner.counters.parked == 1000, 60, "the storm parked")
    assert runner.exchange_check.asked <= 20, f"{runner.exchange_check.asked} questions for one missing exchange"
    assert depth_on(channel, PARKING) == 1000 and depth_on(channel, CONTROL) == 0


@pytest.fixture
def simulated() -> Iterator[tuple[SimulatorBackend, Any]]:
    """A simulated broker with the ladder and the corpus's targets declared: (backend, a channel)."""
    backend = SimulatorBackend()
    try:
        with backend.connection() as conn:
            channel = conn.channel()
            declare(channel)
            corpus.declare_targets(channel)
            yield backend, channel
    finally:
        backend.close()


def test_a_close_nobody_can_attribute_is_resolved_by_sending_one_at_a_time(
    simulated: tuple[SimulatorBackend, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A channel close whose text names no exchange: what was in flight goes again one at a time,
    the culprit is found alone and parked, and nothing is lost (those the broker had taken may come twice)."""
    backend, channel = simulated
    broker = backend.broker
    check = type(broker)._check_publish

    def refuse_poison(self: Any, exchange: str, expiration: Any, user_id: Any) -> None:
        check(self, exchange, expiration, user_id)
        if exchange == "hostile.poison":
            raise PreconditionFailed("PRECONDITION_FAILED - something unforeseen", spec.Basic.Publish, reply_code=406)

    monkeypatch.setattr(type(broker), "_check_publish", refuse_poison)
    channel.exchange_declare("hostile.poison", "fanout", durable=True, auto_delete=False)
    relay = broker.host(Relay())
    now = broker.now_ms
    for n in range(AROUND):
        corpus.publish(channel, corpus.valid(n, now))
    corpus.publish(channel, to("hostile.poison", b"poison", now))
    for n in range(AROUND, 2 * AROUND):
        corpus.publish(channel, corpus.valid(n, now))
    backend.wait_until(lambda: relay.counters.parked == 1 and not relay.core.publisher.pending.jobs, 30,
                       "the poison parked, everything acked")
    got = bodies(channel, corpus.VALID_QUEUE)
    assert set(got) == {b"valid-%d" % n for n in range(2 * AROUND)} and max(got.values()) <= 2
    assert bodies(channel, PARKING) == Counter([b"poison"])
    assert relay.core.publisher._careful is None, "back to pipelining once the suspects are cleared"


def test_a_message_over_max_message_size_is_never_lost(simulated: tuple[SimulatorBackend, Any]) -> None:
    """Over RabbitMQ's max_message_size it can be neither delivered nor parked: it stays unacked, backing off."""
    backend, channel = simulated
    broker = backend.broker
    relay = broker.host(Relay())
    now = broker.now_ms
    corpus.publish(channel, corpus.valid(0, now))
    big = corpus.Case("big", corpus.valid(1, now).raw, b"B" * 5000, "")
    corpus.publish(channel, big)  # the broker took it when its limit was higher
    broker.max_message_size = 4000
    corpus.publish(channel, corpus.valid(2, now))
    backend.wait_until(lambda: relay.counters.delivered == 2, 20, "the small ones delivered")
    backend.wait_until(lambda: held(relay) and held(relay)[0].attempts >= 3, 60, "the big one backing off")
    assert relay.counters.parked == 0 and bodies(channel, corpus.VALID_QUEUE) == Counter([b"valid-0", b"valid-2"])
    broker.max_message_size = 128 * 1024 * 1024  # the operator raises the limit
    backend.wait_until(lambda: not relay.core.publisher.pending.jobs, 120, "the big one parked at last")
    [(raw, body)] = corpus.take_raw(channel, PARKING)
    assert body == big.body
    assert "message size 5000" in corpus.decoded(raw)["application_headers"]["x-ladder-parked-reason"]
    assert (relay.counters.delivered, relay.counters.parked) == (2, 1)


def driven_core(backend: SimulatorBackend, connection: Any) -> RelayCore:
    """A bare RelayCore consuming on ``connection``, which the simulator drives (no exchange check)."""
    core = RelayCore(clock=backend.clock)
    core.consumer(connection.channel()).consume()
    backend.broker.drive(connection, tick=core.tick)
    return core


def test_a_core_without_exchange_check_parks_a_missing_exchange_after_one_channel_close(
    simulated: tuple[SimulatorBackend, Any],
) -> None:
    """RelayCore alone (no side connection): the 404 closes the publishing channel, never the consuming one."""
    backend, channel = simulated
    core = driven_core(backend, backend.connection())
    consuming = core.channel
    now = backend.broker.now_ms
    corpus.publish(channel, corpus.valid(0, now))
    corpus.publish(channel, to("hostile.nope", b"nope", now))
    corpus.publish(channel, corpus.valid(1, now))
    backend.wait_until(lambda: core.counters.parked == 1 and core.counters.delivered == 2, 20, "settled")
    assert core.channel is consuming, "the consuming channel survived"


def test_a_core_takes_a_new_connection_after_the_old_one_is_lost(simulated: tuple[SimulatorBackend, Any]) -> None:
    """What a consumer loop does on reconnect: the same RelayCore, a channel on a new connection."""
    backend, channel = simulated
    first = backend.connection()
    core = driven_core(backend, first)
    corpus.publish(channel, corpus.valid(0, backend.broker.now_ms))
    backend.wait_until(lambda: core.counters.delivered == 1, 10, "a delivery on the first connection")
    first.release()  # the connection is lost
    second = backend.connection()
    core.consumer(second.channel()).consume()
    backend.broker.drive(second)
    corpus.publish(channel, corpus.valid(1, backend.broker.now_ms))
    backend.wait_until(lambda: core.counters.delivered == 2, 10, "a delivery on the new connection")
    assert bodies(channel, corpus.VALID_QUEUE) == Counter([b"valid-0", b"valid-1"])


def test_properties_that_fill_a_frame_never_close_the_connection(simulated: tuple[SimulatorBackend, Any]) -> None:
    """Properties within a few bytes of frame_max: the park's extra headers would not fit in one frame,
    and RabbitMQ closes the whole connection on a bigger one. The message stays unacked, never lost;
    one that can be delivered (its schedule headers removed) is delivered."""
    backend, channel = simulated
    relay = backend.broker.host(Relay())
    now = backend.broker.now_ms
    pad = 131072 - 20 - 40
    fat_bad = corpus.Case("fat", corpus.properties([(b"pad", corpus.text("p" * pad))]), b"fat malformed", "")
    fat_ok = corpus.Case("fat ok", corpus.properties(corpus.schedule(now) + [(b"pad", corpus.text(
        "p" * (pad - 150)))], delivery_mode=2), b"fat valid", "")
    for case in (corpus.valid(0, now), fat_bad, fat_ok, corpus.valid(1, now)):
        corpus.publish(channel, case)
    backend.wait_until(lambda: relay.counters.delivered == 3 and held(relay), 20, "the others delivered")
    backend.wait_until(lambda: held(relay)[0].attempts >= 2, 20, "the fat one backing off")
    assert held(relay)[0].body == b"fat malformed" and relay.counters.parked == 0
    assert bodies(channel, corpus.VALID_QUEUE) == Counter([b"valid-0", b"valid-1", b"fat valid"])
    assert not relay.connection.connection.closed, "the relay's connection is still up"


@pytest.mark.parametrize("target,problem", [
    ({"routing_key": "k" * 256}, "routing_key 'kkk"),
    ({"routing_key": "é" * 128}, "256 bytes of UTF-8"),
    ({"exchange": "x" * 300, "routing_key": "k"}, "exchange 'xxx"),
    ({"exchange": "amq.rabbitmq.trace", "routing_key": "k"}, "internal to RabbitMQ"),
])
def test_our_producer_refuses_at_publish_what_the_relay_would_park(
    simulated: tuple[SimulatorBackend, Any], target: dict[str, str], problem: str,
) -> None:
    """A message our own producer sends is refused when it is published, not parked hours later."""
    backend, channel = simulated
    producer = LadderProducer(channel, clock=backend.clock)
    with pytest.raises(ValueError, match="cannot be delivered to") as refused:
        producer.publish(b"x", countdown=3600, **target)
    assert problem in str(refused.value)
    assert backend.broker.depth("acemq.schedule.1h") == 0


@pytest.mark.broker
def test_a_relay_keeps_its_connection_guard_to_its_own_channels(broker_url: str) -> None:
    """Other channels of the relay's connection (a Celery worker's task channels) see their frames untouched."""
    with Connection(broker_url) as conn:
        declare(conn)
        purge(conn, CONTROL, corpus.VALID_QUEUE)
        other = conn.channel()
        other.queue_declare(queue=corpus.VALID_QUEUE, durable=True, auto_delete=False)
        other.basic_publish(other.prepare_message(b"plain", content_type="text/plain", headers={"k": "v"}),
                            exchange="", routing_key=corpus.VALID_QUEUE)
        core = RelayCore()
        core.consumer(conn.channel()).consume()
        deadline = time.monotonic() + 10
        message = None
        while message is None and time.monotonic() < deadline:
            message = other.basic_get(corpus.VALID_QUEUE, no_ack=True)
        assert message is not None and message.headers == {"k": "v"} and message.content_type == "text/plain"
        core.close()
