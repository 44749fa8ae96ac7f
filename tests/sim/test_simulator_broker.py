"""Simulator-only checks of the RabbitMQ rules it models: routing, TTL, dead-lettering, confirms, consumers."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from amqp.exceptions import AccessRefused, ChannelError, MessageNacked, NotFound, ResourceLocked
from kombu import Consumer, Exchange, Producer, Queue

from kombu_ladder.simulator import SimulatedBroker, SimulatorStalled


@pytest.fixture
def broker() -> Any:
    sim = SimulatedBroker(start=1_800_000_000)
    yield sim
    sim.close()


@pytest.fixture
def conn(broker: SimulatedBroker) -> Any:
    with broker.connection() as connection:
        yield connection


def _bodies(broker: SimulatedBroker, queue: str) -> list[Any]:
    return [m.body for m in broker.take(queue)]


@pytest.mark.parametrize("kind,bindings,key,expected", [
    ("direct", {"q1": "a", "q2": "b"}, "a", ["q1"]),
    ("fanout", {"q1": "a", "q2": "b"}, "zzz", ["q1", "q2"]),
    ("topic", {"q1": "a.*", "q2": "a.#", "q3": "#", "q4": "*.b.*"}, "a.b", ["q1", "q2", "q3"]),
    ("topic", {"q1": "a.*", "q2": "a.#", "q3": "*.b.*"}, "a", ["q2"]),
    ("topic", {"q1": "a.*.c", "q2": "#.c", "q3": "a.#.c"}, "a.b.b.c", ["q2", "q3"]),
])
def test_exchange_types_route_as_rabbitmq(conn: Any, broker: SimulatedBroker, kind: str, bindings: dict[str, str],
                                          key: str, expected: list[str]) -> None:
    exchange = Exchange("x", kind)
    for queue, binding in bindings.items():
        Queue(queue, exchange, routing_key=binding)(conn.default_channel).declare()
    Producer(conn.default_channel).publish(b"m", exchange="x", routing_key=key)
    assert [q for q in bindings if broker.depth(q)] == expected


def test_headers_exchange_and_exchange_to_exchange_bindings(conn: Any, broker: SimulatedBroker) -> None:
    channel = conn.default_channel
    Exchange("h", "headers")(channel).declare()
    Exchange("front", "fanout")(channel).declare()
    channel.exchange_bind(destination="h", source="front")
    Queue("all", Exchange("h", "headers"), binding_arguments={"x-match": "all", "a": 1, "b": 2})(channel).declare()
    Queue("any", Exchange("h", "headers"), binding_arguments={"x-match": "any", "a": 1, "b": 2})(channel).declare()
    producer = Producer(channel)
    producer.publish(b"both", exchange="front", headers={"a": 1, "b": 2})
    producer.publish(b"one", exchange="front", headers={"a": 1})
    assert (_bodies(broker, "all"), _bodies(broker, "any")) == ([b"both"], [b"both", b"one"])


def test_queue_ttl_dead_letters_in_due_order_with_the_original_routing_key(conn: Any, broker: SimulatedBroker) -> None:
    channel = conn.default_channel
    dlx = Exchange("dlx", "topic")
    Queue("dead", dlx, routing_key="#")(channel).declare()
    Queue("slow", queue_arguments={"x-message-ttl": 5000, "x-dead-letter-exchange": "dlx"})(channel).declare()
    Queue("fast", queue_arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"})(channel).declare()
    Producer(channel).publish(b"slow", routing_key="slow")
    Producer(channel).publish(b"fast", routing_key="fast")
    broker.advance(0.999)
    assert broker.depth("dead") == 0
    broker.advance(10)
    arrivals = [(a.at - 1_800_000_000, a.message.body, a.message.delivery_info["routing_key"])
                for a in broker.arrivals("dead")]
    assert arrivals == [(1.0, b"fast", "fast"), (5.0, b"slow", "slow")]
    assert broker.stats["expired"] == 2


def test_a_dead_letter_cycle_without_rejections_drops_the_message(conn: Any, broker: SimulatedBroker) -> None:
    Queue("loop", queue_arguments={"x-message-ttl": 100, "x-dead-letter-exchange": ""})(conn.default_channel).declare()
    Producer(conn.default_channel).publish(b"m", routing_key="loop")
    broker.advance(1)
    assert broker.depth("loop") == 0
    assert (broker.stats["dead_lettered"], broker.stats["dropped"]) == (1, 1)


def test_max_length_drops_the_head_as_maxlen_or_refuses_the_publish(conn: Any, broker: SimulatedBroker) -> None:
    channel = conn.channel()
    Queue("dead")(channel).declare()
    Queue("capped", queue_arguments={"x-max-length": 2, "x-dead-letter-exchange": "",
                                     "x-dead-letter-routing-key": "dead"})(channel).declare()
    Queue("strict", queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"})(channel).declare()
    for body in (b"1", b"2", b"3"):
        Producer(channel).publish(body, routing_key="capped")
    assert _bodies(broker, "capped") == [b"2", b"3"]
    (dropped,) = broker.take("dead")
    assert (dropped.body, dropped.headers["x-death"][0]["reason"]) == (b"1", "maxlen")
    channel.basic_publish_confirm(channel.prepare_message(b"a"), exchange="", routing_key="strict")
    with pytest.raises(MessageNacked):
        channel.basic_publish_confirm(channel.prepare_message(b"b"), exchange="", routing_key="strict")


def test_prefetch_limits_deliveries_and_a_closed_channel_requeues_as_redelivered(conn: Any,
                                                                                 broker: SimulatedBroker) -> None:
    channel = conn.channel()
    Queue("work")(channel).declare()
    for i in range(5):
        Producer(channel).publish(str(i).encode(), routing_key="work")
    got: list[Any] = []
    consumer = Consumer(channel, [Queue("work")], callbacks=[lambda body, message: got.append(message)],
                        prefetch_count=2)
    consumer.consume()
    conn.drain_events(timeout=0)
    assert [m.body for m in got] == [b"0", b"1"] and broker.depth("work") == 3
    got[0].ack()
    conn.drain_events(timeout=0)
    assert [m.body for m in got] == [b"0", b"1", b"2"]
    channel.close()
    requeued = broker.messages("work")
    assert [(m.body, m.delivery_info["redelivered"]) for m in requeued] == [
        (b"1", True), (b"2", True), (b"3", False), (b"4", False)]


def test_exclusive_and_auto_delete_queues(broker: SimulatedBroker) -> None:
    with broker.connection() as owner, broker.connection() as other:
        Queue("mine", exclusive=True)(owner.default_channel).declare()
        with pytest.raises(ResourceLocked):
            other.default_channel.queue_declare(queue="mine", passive=True)
        Queue("temp", auto_delete=True)(other.default_channel).declare()
        consumer = Consumer(other.default_channel, [Queue("temp", auto_delete=True)], callbacks=[lambda *a: None])
        consumer.consume()
        consumer.cancel()
        assert "temp" not in broker.queue_names()
    assert "mine" not in broker.queue_names()


def test_channel_errors_reset_the_channel_as_py_amqp_does(conn: Any, broker: SimulatedBroker) -> None:
    channel = conn.channel()
    channel.queue_declare(queue="fine")
    # A publish does not wait: the broker's channel.close comes later, and what was published
    # on the channel meanwhile is dropped, as RabbitMQ does.
    channel.basic_publish(channel.prepare_message(b"x"), exchange="missing", routing_key="k")
    channel.basic_publish(channel.prepare_message(b"dropped"), exchange="", routing_key="fine")
    with pytest.raises(NotFound, match="no exchange 'missing'"):  # read instead of the declare's reply
        channel.queue_declare(queue="fine", passive=True)
    assert broker.depth("fine") == 0
    with pytest.raises(NotFound):
        channel.queue_declare(queue="missing", passive=True)
    with pytest.raises(AccessRefused):
        channel.queue_bind(queue="q", exchange="")
    assert channel.queue_declare(queue="fine").queue == "fine"  # the channel is usable again


def test_a_channel_closed_by_a_publish_raises_from_drain_events_like_py_amqp(conn: Any) -> None:
    channel = conn.channel()
    channel.basic_publish(channel.prepare_message(b"x"), exchange="amq.rabbitmq.trace", routing_key="k")
    with pytest.raises(AccessRefused, match="cannot publish to internal exchange 'amq.rabbitmq.trace'"):
        conn.drain_events(timeout=0)
    assert channel.queue_declare(queue="after").queue == "after"  # reopened, as py-amqp does


def test_a_return_without_handler_raises_from_drain_events_like_py_amqp(conn: Any, broker: SimulatedBroker) -> None:
    Exchange("x", "direct")(conn.default_channel).declare()
    Producer(conn.default_channel).publish(b"m", exchange="x", routing_key="nowhere", mandatory=True)
    with pytest.raises(ChannelError, match="NO_ROUTE"):
        conn.drain_events(timeout=0)
    with pytest.raises(socket.timeout):
        conn.drain_events(timeout=0)
    assert broker.stats["returned"] == 1


def test_consecutive_confirms_are_batched_with_multiple(conn: Any) -> None:
    channel = conn.channel()
    channel.confirm_select()
    acks: list[tuple[int, bool]] = []
    channel.events["basic_ack"].add(lambda tag, multiple: acks.append((tag, multiple)))
    for _ in range(3):
        channel.basic_publish(channel.prepare_message(b"m"), exchange="", routing_key="nowhere")
    conn.drain_events(timeout=0)
    assert acks == [(3, True)]


def test_clock_validation_and_urls(broker: SimulatedBroker) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        broker.advance(-1)
    with pytest.raises(TypeError, match="seconds"):
        broker.advance("1")  # type: ignore[arg-type]
    assert broker.url == f"ladder-sim://localhost/{broker.name}"
    assert int(broker.now() * 1000) == broker.now_ms == 1_800_000_000_000


def test_settle_reports_a_consumer_thread_that_never_comes_back(broker: SimulatedBroker) -> None:
    import threading

    broker.settle_timeout = 0.2
    stuck = threading.Event()
    with broker.connection() as conn:
        Queue("q")(conn.default_channel).declare()

        def consume() -> None:
            consumer = Consumer(conn.channel(), [Queue("q")], callbacks=[lambda *a: None])
            consumer.consume()
            stuck.wait(5)  # registered a consumer, then never drains

        thread = threading.Thread(target=consume)
        thread.start()
        try:
            broker.settle()
            Producer(conn.default_channel).publish(b"m", routing_key="q")
            with pytest.raises(SimulatorStalled, match="did not handle"):
                broker.advance(1)
        finally:
            stuck.set()
            thread.join()
