"""Issue 24: a delayed publish hands py-amqp its properties encoded, and keeps what kombu's publish does around it."""

from __future__ import annotations

import json
import socket
from typing import Any, Iterator

import pytest
from amqp.exceptions import MessageNacked
from backends import declare_target, get
from helpers import rabbitmqctl, vhost_url, wait_for
from kombu import Connection, Exchange, Producer, Queue

import kombu_ladder.producer as producer_module
from kombu_ladder import LadderProducer, declare
from kombu_ladder.contract import EXCHANGE, rung_name
from kombu_ladder.link import RawMessage

HOUR_RUNG = rung_name(3600)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every message a LadderProducer hands a channel's basic_publish, recorded."""
    messages: list[Any] = []
    original = producer_module.RawMessage

    class Recorded(original):  # type: ignore[misc, valid-type]
        def __init__(self, body: bytes, raw: bytes) -> None:
            super().__init__(body, raw)
            messages.append(self)

    monkeypatch.setattr(producer_module, "RawMessage", Recorded)
    return messages


def generic_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the producer let kombu and py-amqp encode every rung message (the path before issue 24)."""
    monkeypatch.setattr(producer_module, "sends_encoded", lambda channel: False)


def read_back(backend: Any, conn: Connection, queue: str = HOUR_RUNG) -> Any:
    """The next message in ``queue`` (published on any channel: RabbitMQ orders channels apart)."""
    return backend.wait_until(lambda: get(conn, queue), 10, f"a message in {queue}")


def comparable(message: Any) -> dict[str, Any]:
    """What a consumer sees of a rung message, the due time aside (it differs by a millisecond or two)."""
    headers = dict(message.headers)
    assert isinstance(headers.pop("x-schedule-due-at"), int)
    properties = {k: v for k, v in message.properties.items() if k != "application_headers"}
    return {"body": message.body, "headers": headers, "properties": properties}


@pytest.mark.parametrize("publish", [
    {"body": b"\x00raw", "content_type": "application/octet-stream"},
    {"body": {"invoice": 7}, "headers": {"app": "h", "nested": {"l": [1, None, True]}}, "correlation_id": "c-1",
     "reply_to": "", "message_id": "m", "app_id": "billing", "priority": 5, "delivery_mode": 1},
    {"body": "héllo", "serializer": "json", "headers": {"big": 2**40, "f": 0.25}, "timestamp": 1790000000},
    {"body": "text", "content_type": "text/plain", "content_encoding": "latin-1"},
], ids=["bytes", "json-dict-with-properties", "json-text", "text-latin-1"])
def test_the_encoded_rung_message_reads_back_as_the_one_py_amqp_encoded(
    ladder_backend: Any, monkeypatch: pytest.MonkeyPatch, sent: list[Any], publish: dict[str, Any],
) -> None:
    publish = dict(publish)
    body = publish.pop("body")
    with ladder_backend.connection() as conn:
        declare(conn)
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish(body, exchange="billing", routing_key="invoice.due", countdown=3600, **publish)
        assert len(sent) == 1 and isinstance(sent[0], RawMessage)  # the encoded path was taken
        encoded = comparable(read_back(ladder_backend, conn))
        with monkeypatch.context() as patch:
            generic_path(patch)
            producer.publish(body, exchange="billing", routing_key="invoice.due", countdown=3600, **publish)
        assert len(sent) == 1
        assert encoded == comparable(read_back(ladder_backend, conn))


def test_a_header_only_py_amqp_encodes_takes_kombu_s_path_and_reads_back(
    ladder_backend: Any, sent: list[Any],
) -> None:
    from decimal import Decimal

    with ladder_backend.connection() as conn:
        declare(conn)
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish(b"x", routing_key="t.q", countdown=3600, headers={"amount": Decimal("9.99")})
        assert sent == []
        assert read_back(ladder_backend, conn).headers["amount"] == Decimal("9.99")


def test_an_unencodable_header_raises_what_kombu_s_publish_raises(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.plain")
        with pytest.raises(Exception) as plain:
            Producer(conn.default_channel).publish(b"x", routing_key="t.plain", headers={"o": object()})
        with pytest.raises(Exception) as ladder:
            LadderProducer(conn.default_channel, clock=ladder_backend.clock).publish(
                b"x", routing_key="t.plain", countdown=3600, headers={"o": object()})
        assert type(ladder.value) is type(plain.value)


def test_compression_is_applied_once_whether_asked_for_or_the_producer_s_default(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        declare(conn)
        channel = conn.default_channel
        for producer, options in ((LadderProducer(channel, clock=ladder_backend.clock, compression="zlib"), {}),
                                  (LadderProducer(channel, clock=ladder_backend.clock, compression="zlib"),
                                   {"compression": "zlib"}),
                                  (LadderProducer(channel, clock=ladder_backend.clock), {"compression": "zlib"})):
            producer.publish({"n": 1}, routing_key="t.q", countdown=3600, serializer="json", **options)
            message = read_back(ladder_backend, conn)
            assert message.headers["compression"] == "application/x-gzip"
            assert not message.errors  # kombu decompressed it on receipt: zlib data it was
            assert json.loads(message.body) == {"n": 1}  # once: twice would leave zlib data here


def test_declare_and_the_producer_s_own_exchange_are_declared_as_kombu_declares_them(ladder_backend: Any,
                                                                                     sent: list[Any]) -> None:
    with ladder_backend.connection() as conn:
        declare(conn)
        channel = conn.channel()
        for name in ("t.declared",):
            channel.queue_delete(name)
        channel.exchange_delete("t.own")
        producer = LadderProducer(conn.default_channel, exchange=Exchange("t.own", type="direct"),
                                  clock=ladder_backend.clock)
        producer.publish(b"x", routing_key="k", countdown=3600, declare=[Queue("t.declared", durable=True)])
        assert len(sent) == 1
        channel.queue_declare("t.declared", passive=True)  # raises NOT_FOUND had it not been declared
        channel.exchange_declare("t.own", "direct", passive=True)
        assert read_back(ladder_backend, conn).headers["x-schedule-exchange"] == "t.own"


def test_mandatory_reaches_the_broker(ladder_backend: Any, sent: list[Any]) -> None:
    returned: list[tuple[Any, ...]] = []
    with ladder_backend.connection() as conn:
        declare(conn)
        channel = conn.channel()
        producer = LadderProducer(channel, clock=ladder_backend.clock,
                                  on_return=lambda *args: returned.append(args))
        producer.publish(b"first", routing_key="k", countdown=3600)  # declares the ladder on this connection
        assert read_back(ladder_backend, conn).body == b"first"
        channel.queue_unbind(HOUR_RUNG, EXCHANGE, HOUR_RUNG)
        try:
            producer.publish(b"nowhere", routing_key="k", countdown=3600, mandatory=True)
            assert len(sent) == 2

            def came_back() -> bool:
                try:
                    conn.drain_events(timeout=0.05)
                except socket.timeout:
                    pass
                return bool(returned)

            ladder_backend.wait_until(came_back, 10, "the mandatory publish's return")
            exc, exchange, routing_key, message = returned[0]
            assert (exchange, routing_key, bytes(message.body)) == (EXCHANGE, HOUR_RUNG, b"nowhere")
            assert message.headers["x-schedule-routing-key"] == "k"
        finally:
            channel.queue_bind(HOUR_RUNG, EXCHANGE, HOUR_RUNG)


def test_timeout_and_confirm_timeout_reach_the_channel(ladder_backend: Any, sent: list[Any]) -> None:
    calls: list[dict[str, Any]] = []
    with ladder_backend.connection() as conn:
        declare(conn)
        channel = conn.channel()
        original = channel.basic_publish

        def recording(message: Any, **options: Any) -> Any:
            calls.append(options)
            return original(message, **options)

        channel.basic_publish = recording
        producer = LadderProducer(channel, clock=ladder_backend.clock)
        options = {"timeout": 7.5}
        if "confirm_timeout" in producer_module.PUBLISH_OPTIONS:  # kombu 5.5 and later
            options["confirm_timeout"] = 2.5
        producer.publish(b"x", routing_key="k", countdown=3600, **options)
        assert len(sent) == 1
        assert calls == [{"exchange": EXCHANGE, "routing_key": HOUR_RUNG, "mandatory": False, "immediate": False,
                          **options}]
        assert read_back(ladder_backend, conn).body == b"x"


def test_a_publish_batch_is_honoured(ladder_backend: Any, sent: list[Any]) -> None:
    with ladder_backend.connection() as conn:
        declare(conn)
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        if not hasattr(producer, "batch"):
            pytest.skip("Producer.batch is kombu 5.7's")
        with producer.batch():
            for n in range(3):
                producer.publish(b"%d" % n, routing_key="k", countdown=3600)
        assert len(sent) == 3
        assert sorted(bytes(read_back(ladder_backend, conn).body) for _ in range(3)) == [b"0", b"1", b"2"]


@pytest.fixture
def nacking_vhost(fresh_vhost: str) -> Iterator[str]:
    """A vhost whose 1 h rung refuses every publish (a policy: max-length 0, reject-publish)."""
    rabbitmqctl("set_policy", "-p", fresh_vhost, "--apply-to", "queues", "refuse-1h", r"^acemq\.schedule\.1h$",
                '{"max-length": 0, "overflow": "reject-publish"}')
    yield vhost_url(fresh_vhost)


def test_with_confirms_a_nack_raises_and_an_ack_returns_once_the_rung_holds_it(nacking_vhost: str,
                                                                              sent: list[Any]) -> None:
    with Connection(nacking_vhost, transport_options={"confirm_publish": True}) as conn:
        declare(conn)
        producer = LadderProducer(conn.default_channel)
        with pytest.raises(MessageNacked):
            producer.publish(b"refused", routing_key="k", countdown=3600)
        producer.publish(b"kept", routing_key="k", countdown=30)
        assert len(sent) == 2
        _, depth, _ = conn.channel().queue_declare(rung_name(10), passive=True)
        assert depth == 1  # confirmed: the broker holds it by the time publish returns


def _cut(conn: Connection) -> None:
    """Break the connection's socket under py-amqp, as a dead network does."""
    conn.connection.sock.shutdown(socket.SHUT_RDWR)


def test_retry_reconnects_and_publishes_and_without_it_the_error_is_raised(broker_url: str,
                                                                           sent: list[Any]) -> None:
    with Connection(broker_url) as watcher:
        declare(watcher)
        watcher.default_channel.queue_purge(HOUR_RUNG)
        for retry in (False, True):
            with Connection(broker_url) as conn:
                producer = LadderProducer(conn)
                producer.publish(b"first", routing_key="k", countdown=3600)
                # in the rung before the cut: a publish in flight when a connection dies may be lost
                waiting = 2 if retry else 1
                wait_for(lambda: _depth(watcher) == waiting, 10, message="the first publish")  # noqa: B023
                _cut(conn)
                if not retry:
                    with pytest.raises(conn.recoverable_connection_errors):
                        producer.publish(b"lost", routing_key="k", countdown=3600)
                else:
                    producer.publish(b"retried", routing_key="k", countdown=3600, retry=True,
                                     retry_policy={"max_retries": 3, "interval_start": 0, "interval_step": 0.1})
        assert all(isinstance(m, RawMessage) for m in sent) and len(sent) == 4
        wait_for(lambda: _depth(watcher) >= 3, 10, message="the retried publish in the 1 h rung")
        assert sorted(bytes(get(watcher, HOUR_RUNG).body) for _ in range(3)) == [b"first", b"first", b"retried"]
        assert _depth(watcher) == 0


def _depth(conn: Connection) -> int:
    return int(conn.default_channel.queue_declare(HOUR_RUNG, passive=True)[1])
