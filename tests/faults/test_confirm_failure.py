"""Fault: the republish is nacked, or the connection dies before its confirm; the expiry is not acked."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator

import pytest
from helpers import queue_depth as depth
from kombu import Connection, Producer, Queue

from kombu_ladder import Relay, declare
from kombu_ladder.contract import CONTROL, MESSAGE_TYPE
from kombu_ladder.envelope import scheduled_headers
from kombu_ladder.relay import RelayCore

from .faultkit import take_figures, wait_until

pytestmark = pytest.mark.broker

#: Expired messages put on the control queue by each test.
COUNT = 5


def put_due(conn: Connection, target: str, count: int) -> None:
    """Put ``count`` already-due messages for queue ``target`` straight on the control queue."""
    producer = Producer(conn.default_channel)
    now_ms = int(time.time() * 1000)
    for n in range(count):
        producer.publish(
            {"n": n}, exchange="", routing_key=CONTROL, serializer="json", delivery_mode=2,
            type=MESSAGE_TYPE,
            headers=scheduled_headers({}, exchange="", routing_key=target, due_at=now_ms - 1000,
                                      content_type="application/json"),
        )


@pytest.fixture
def conn(fault_url: str) -> Iterator[Connection]:
    with Connection(fault_url) as connection:
        declare(connection)
        yield connection


def drive(core: RelayCore, url: str, seconds: float) -> Connection:
    """Run ``core`` on a fresh connection for ``seconds``; return the (still open) connection."""
    connection = Connection(url)
    channel = connection.channel()
    core.consumer(channel).consume()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            connection.drain_events(timeout=0.2)
        except socket.timeout:
            pass
    return connection


def relay_every_expiry(conn: Connection, when: str) -> Relay:
    """Run a :class:`Relay` until it has delivered all ``COUNT`` expiries; stop it and return it.

    Every delivery confirmed, not merely one: a retried expiry comes back due a few seconds
    ahead, and the relay holds it unacked (the control queue reads 0, nothing is outstanding)
    until then; and the relay takes several expiries at once but confirms them one by one.
    """
    relay = Relay(conn.clone())
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: relay.counters.delivered >= COUNT and not relay.core.outstanding
                   and depth(conn, CONTROL) == 0, 20, f"every expiry relayed {when}")
    finally:
        relay.stop()
        thread.join(10)
        relay.connection.release()
    return relay


def test_nacked_republish_is_not_acked(conn: Connection, fault_url: str, report: dict[str, Any]) -> None:
    target = "faults.full"
    Queue(target, durable=True, queue_arguments={"x-max-length": COUNT, "x-overflow": "reject-publish"})(
        conn.default_channel).declare()
    producer = Producer(conn.default_channel)
    for _ in range(COUNT):  # the target is full: every delivery to it is nacked
        producer.publish({"n": -1}, routing_key=target, serializer="json")
    put_due(conn, target, COUNT)

    core = RelayCore()
    relay_conn = drive(core, fault_url, 2.0)
    nacked_rounds = core.counters.received
    assert core.counters.received >= COUNT, "the relay should have tried every expiry"
    assert core.counters.delivered == 0
    # A refused delivery waits in the 1 s rung before it is tried again: about two tries per
    # message in 2 s, never a tight requeue loop (which made thousands).
    assert nacked_rounds <= COUNT * 4, f"{nacked_rounds} tries in 2 s: the relay spins on nacks"
    relay_conn.release()  # whatever the relay still held goes back to the control queue
    wait_until(lambda: depth(conn, CONTROL) == COUNT, 10, "every nacked expiry back on the control queue")
    assert depth(conn, target) == COUNT

    conn.default_channel.queue_purge(target)  # the operator makes room
    relay = relay_every_expiry(conn, "once the target had room")
    figures = take_figures(conn, target, COUNT)
    report.update(figures, nacked_attempts_in_2s=nacked_rounds)
    assert figures == {"sent": COUNT, "delivered": COUNT, "duplicated": 0, "lost": 0}
    assert relay.counters.delivered == COUNT


def test_connection_lost_before_confirm_is_not_acked(conn: Connection, fault_url: str,
                                                     report: dict[str, Any]) -> None:
    target = "faults.lost-confirm"
    Queue(target, durable=True)(conn.default_channel).declare()
    put_due(conn, target, COUNT)

    core = RelayCore()
    relay_conn = Connection(fault_url)
    channel = relay_conn.channel()
    consumer = core.consumer(channel)
    consumer.consume()
    # The confirms never reach the relay, as when its connection dies between the
    # publish and the confirm: it publishes every expiry and must ack none of them.
    core.publisher.channel.events["basic_ack"].discard(core.publisher._on_ack)
    wait_until(lambda: _drain(relay_conn) or core.counters.received == COUNT, 10, "every expiry received")
    wait_until(lambda: depth(conn, target) == COUNT, 10, "the republished copies to reach the target")
    assert core.outstanding == COUNT
    relay_conn.connection.sock.shutdown(socket.SHUT_RDWR)
    relay_conn.connection.sock.close()
    wait_until(lambda: depth(conn, CONTROL) == COUNT, 15, "all expiries back on the control queue")
    assert core.counters.delivered == 0

    relay = relay_every_expiry(conn, "after the reconnect")
    # At least once: each message whose confirm was lost is delivered twice; none is lost.
    figures = take_figures(conn, target, COUNT)
    report.update(figures)
    assert figures == {"sent": COUNT, "delivered": COUNT, "duplicated": COUNT, "lost": 0}
    assert relay.counters.delivered == COUNT


def _drain(connection: Connection) -> bool:
    try:
        connection.drain_events(timeout=0.1)
    except socket.timeout:
        pass
    return False
