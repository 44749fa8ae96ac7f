"""The relay's confirm bookkeeping stays aligned with the broker's while deliveries keep arriving."""

from __future__ import annotations

import socket
import time

import pytest
from helpers import queue_depth, wait_for
from kombu import Connection, Producer, Queue

from kombu_ladder import declare
from kombu_ladder.contract import CONTROL, MESSAGE_TYPE
from kombu_ladder.envelope import scheduled_headers
from kombu_ladder.relay import RelayCore

pytestmark = pytest.mark.broker

#: Expired messages per target.
EACH = 100


def test_counters_match_the_broker_when_half_the_deliveries_are_refused(connection: Connection) -> None:
    """Half the targets refuse (a full queue with reject-publish), half accept, interleaved.

    Refused deliveries are retried through the 1 s rung; accepted ones are counted
    as delivered. If the relay's confirm numbers drifted from the broker's (for
    instance by publishing a nested message ahead of the current one), refusals
    and acceptances would be attributed to the wrong messages and the counters
    would disagree with what the queues hold.
    """
    declare(connection)
    channel = connection.default_channel
    ok = Queue("order.ok", durable=True)
    full = Queue("order.full", durable=True, queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    for queue in (ok, full):
        queue(channel).declare()
        queue(channel).purge()
    producer = Producer(channel)
    producer.publish({"filler": True}, routing_key="order.full", serializer="json")
    now_ms = int(time.time() * 1000)
    for n in range(2 * EACH):
        target = "order.ok" if n % 2 else "order.full"
        producer.publish({"n": n}, exchange="", routing_key=CONTROL, serializer="json", type=MESSAGE_TYPE,
                         headers=scheduled_headers({}, exchange="", routing_key=target, due_at=now_ms - 5,
                                                   content_type="application/json"))

    core = RelayCore()
    with Connection(connection.as_uri(include_password=True)) as relay_conn:
        core.consumer(relay_conn.channel()).consume()

        def pumped_until_all_ok_delivered() -> bool:
            try:
                relay_conn.drain_events(timeout=0.1)
            except socket.timeout:
                pass
            return queue_depth(connection, "order.ok") == EACH and core.outstanding == 0

        wait_for(pumped_until_all_ok_delivered, 60, interval=0, message="every accepted delivery")
        assert core.counters.delivered == EACH
        assert queue_depth(connection, "order.full") == 1, "the full target never took more"
        assert core.counters.received >= 2 * EACH
        assert core.counters.parked == 0 and core.counters.malformed == 0
    for queue in (ok, full):
        queue(channel).delete()
