"""Issue 28: each role's documented permissions, given to real users in a vhost of the test's own.

A producer schedules and can do nothing else (no declare, no delete, no cancel); a canceller
cancels through ``ladder.cancellations`` and cannot write into any other queue; an operator
declares and operates. Each user is created with ``rabbitmqctl add_user`` and deleted afterwards.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Callable

import amqp
import pytest
from helpers import broker_release, queue_depth, vhost_url, wait_for
from kombu import Connection, Exchange, Queue

from kombu_ladder import LadderProducer, Relay, cancel
from kombu_ladder.cancellation.records import STREAM
from kombu_ladder.cli import main as kombu_ladder
from kombu_ladder.contract import CONTROL, EXCHANGE, PARKING
from kombu_ladder.errors import CancellationsUnavailable, LadderNotDeclared
from kombu_ladder.permissions import Permissions, canceller, operator, producer, relay, union

pytestmark = pytest.mark.broker

BILLING = "billing"
#: A task queue of the application's, reached through the default exchange.
TASKS = "tasks.q"


@pytest.fixture
def application(fresh_vhost: str) -> str:
    """The application's own topology, declared by its owner (guest): ``billing`` and a task queue."""
    url = vhost_url(fresh_vhost)
    with Connection(url) as admin:
        exchange = Exchange(BILLING, type="direct", durable=True)
        Queue(f"{BILLING}.q", exchange, routing_key="invoice.due", durable=True)(admin.default_channel).declare()
        Queue(TASKS, durable=True)(admin.default_channel).declare()
    return url


def operate(url: str, *args: str) -> int:
    """``kombu-ladder --broker URL ARGS`` in this process; its exit status."""
    return kombu_ladder(["--broker", url, "--log-level", "WARNING", *args])


class RelayThread:
    """A standalone relay in a thread of the test's, as a given user."""

    def __init__(self, url: str, allowed: list[str]) -> None:
        self.relay = Relay(Connection(url), allowed_exchanges=allowed)
        self.thread = threading.Thread(target=self.relay.run, daemon=True)

    def __enter__(self) -> Relay:
        self.thread.start()
        wait_for(self.relay.ready.is_set, 30, message="the relay consuming")
        return self.relay

    def __exit__(self, *exc: Any) -> None:
        self.relay.stop()
        self.thread.join(15)
        self.relay.connection.release()


def refused(url: str, action: Callable[[Any], Any]) -> bool:
    """Whether the broker refuses ``action(channel)`` to this user with ACCESS_REFUSED (a round trip follows it)."""
    with Connection(url) as conn:
        channel = conn.channel()
        try:
            action(channel)
            # A round trip that needs no permission, to receive an asynchronous refusal (a passive declare
            # would not do: from RabbitMQ 4.2.6 it is refused to a user without permission on the queue).
            channel.basic_qos(0, 0, False)
        except amqp.exceptions.AccessRefused:
            return True
        return False


def publish(exchange: str, routing_key: str) -> Callable[[Any], Any]:
    return lambda channel: channel.basic_publish(amqp.Message(b"forged"), exchange=exchange, routing_key=routing_key)


def test_a_producer_schedules_with_its_rights_and_can_declare_delete_or_cancel_nothing(
        make_user: Callable[[str, Permissions], str], application: str) -> None:
    assert operate(make_user("operator", operator([BILLING])), "declare") == 0
    producer_url = make_user("producer", producer([BILLING]))
    with RelayThread(make_user("relay", relay([BILLING])), [BILLING]):
        with Connection(producer_url) as conn:
            ladder = LadderProducer(conn.default_channel, serializer="json")
            for n in range(4):
                ladder.publish({"n": n}, exchange=BILLING, routing_key="invoice.due", countdown=1.2 + n / 10)
            ladder.publish({"n": 4}, exchange=BILLING, routing_key="invoice.due", countdown=0.2)  # straight there
        with Connection(application) as admin:
            wait_for(lambda: queue_depth(admin, f"{BILLING}.q") == 5, 30, message="five deliveries to billing")

    # It cannot delete the stream, a rung or the ladder's exchange (no configure), nor declare anything.
    assert refused(producer_url, lambda channel: channel.queue_delete(STREAM))
    assert refused(producer_url, lambda channel: channel.queue_delete("acemq.schedule.1s"))
    assert refused(producer_url, lambda channel: channel.queue_delete(PARKING))
    assert refused(producer_url, lambda channel: channel.exchange_delete(EXCHANGE))
    assert refused(producer_url, lambda channel: channel.queue_declare("acemq.schedule.7s", durable=True))
    # Nor write into a queue by name, the stream included, nor cancel.
    assert refused(producer_url, publish("", STREAM))
    assert refused(producer_url, publish("", TASKS))
    assert refused(producer_url, publish(STREAM, ""))
    with Connection(producer_url) as conn, pytest.raises(CancellationsUnavailable, match="kombu-ladder declare"):
        cancel(conn, "someone-elses")
    with Connection(application) as admin:
        assert queue_depth(admin, TASKS) == 0


def test_a_producer_finds_an_undeclared_ladder_missing_in_one_clear_error(
        make_user: Callable[[str, Permissions], str], application: str) -> None:
    # From RabbitMQ 4.2.6 a passive declare needs a permission on the queue, and the producer has none on the
    # rungs: it can find only the exchange missing (on 3.x every missing queue is named too).
    rungs = r", .*" if broker_release() < (4, 2, 6) else ""
    with Connection(make_user("producer", producer([BILLING]))) as conn:
        ladder = LadderProducer(conn.default_channel)
        with pytest.raises(LadderNotDeclared,
                           match=rf"\(acemq\.schedule{rungs} missing\) and this user may not declare"):
            ladder.publish(b"x", exchange=BILLING, routing_key="invoice.due", countdown=30)


def test_a_canceller_cancels_through_its_exchange_and_cannot_write_into_any_queue(
        make_user: Callable[[str, Permissions], str], application: str) -> None:
    assert operate(make_user("operator", operator([BILLING])), "declare") == 0
    sender_url = make_user("sender", union(producer([BILLING]), canceller()))
    canceller_url = make_user("canceller", canceller())
    with RelayThread(make_user("relay", relay([BILLING])), [BILLING]) as running:
        with Connection(sender_url) as conn:
            ladder = LadderProducer(conn.default_channel)
            ladder.publish(b"doomed", exchange=BILLING, routing_key="invoice.due", countdown=2.5,
                           message_id="doomed-1")
            ladder.publish(b"kept", exchange=BILLING, routing_key="invoice.due", countdown=2.5, message_id="kept-1")
        with Connection(canceller_url) as conn:
            cancel(conn, "doomed-1")  # confirmed, through the exchange ladder.cancellations
        wait_for(lambda: running.counters.cancelled == 1 and running.counters.delivered == 1, 30,
                 message="the cancelled message dropped, its sibling delivered")
    with Connection(application) as admin:
        channel = admin.channel()
        delivered = channel.basic_get(f"{BILLING}.q", no_ack=True)
        assert delivered is not None and delivered.body == b"kept"
        assert channel.basic_get(f"{BILLING}.q", no_ack=True) is None

    # The canceller writes nowhere else: not a task queue, not the stream by name, not the ladder.
    assert refused(canceller_url, publish("", TASKS))
    assert refused(canceller_url, publish("", STREAM))
    assert refused(canceller_url, publish("", CONTROL))
    assert refused(canceller_url, publish(EXCHANGE, CONTROL))
    # It can neither delete, declare nor read the stream.
    assert refused(canceller_url, lambda channel: channel.queue_delete(STREAM))
    assert refused(canceller_url, lambda channel: channel.exchange_delete(STREAM))
    assert refused(canceller_url, lambda channel: channel.basic_consume(
        STREAM, callback=lambda m: None, arguments={"x-stream-offset": "first"}))
    with Connection(application) as admin:
        assert queue_depth(admin, TASKS) == 0


def test_write_on_the_default_exchange_reaches_the_stream_which_no_regexp_can_prevent(
        make_user: Callable[[str, Permissions], str], application: str) -> None:
    """What the docs say RabbitMQ cannot express: write on amq.default is write into every queue by name."""
    assert operate(make_user("operator", operator([BILLING])), "declare") == 0
    celery_like = make_user("producer", producer(["", BILLING]))
    assert not refused(celery_like, publish("", STREAM))
    assert not refused(celery_like, publish("", TASKS))


def test_the_operator_declares_and_operates_with_its_rights(
        make_user: Callable[[str, Permissions], str], application: str) -> None:
    url = make_user("operator", operator([BILLING]))
    assert operate(url, "declare") == 0
    assert operate(url, "declare") == 0  # idempotent
    assert operate(url, "status") == 0
    assert operate(url, "check", "--min-relays", "0") == 0
    assert operate(url, "cancel", "order-1") == 0
    assert operate(url, "replay") == 0
    wait_for(lambda: "order-1" in stream_ids(application), 10, message="the operator's record in the stream")


def stream_ids(url: str) -> list[str]:
    """The ids of the records in the stream, read from its first (as guest)."""
    ids: list[str] = []
    with Connection(url) as conn:
        channel = conn.channel()
        channel.basic_qos(0, 1000, False)
        channel.basic_consume(STREAM, callback=lambda m: ids.append(json.loads(m.body)["id"]),
                              arguments={"x-stream-offset": "first"})
        try:
            while True:
                conn.drain_events(timeout=0.5)
        except socket.timeout:
            return ids
