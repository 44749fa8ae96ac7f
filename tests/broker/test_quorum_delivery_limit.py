"""Quorum queues' delivery limit against the quorum profile, on the release under test (3.10 or 4.x).

RabbitMQ 4.0 to 4.2 give every quorum queue a delivery limit of 20; 3.x has none unless a
policy sets one. A message that a consumer takes and then hands back without an ack (its
channel closes: what a relay's crash or lost connection does) counts one delivery. These
tests measure what each release does, and that the quorum profile's control queue parks a
message that spent its limit instead of dropping it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import broker_release, rabbitmqctl, vhost_url, wait_for
from kombu import Connection

from kombu_ladder import declare
from kombu_ladder.contract import CONTROL, PARKING
from kombu_ladder.parking import parked_reasons

pytestmark = pytest.mark.broker

#: Hand-backs tried before concluding a release sets no limit (more than 4.x's default of 20).
TRIES = 25


def hand_back_until_gone(conn: Connection, queue: str, tries: int = TRIES) -> int:
    """Take the one message in ``queue`` and hand it back (its channel closes unacked) until it is
    gone; return how many times it was delivered."""
    wait_for(lambda: _depth(conn, queue), 5, message=f"a message on {queue}")
    deliveries = 0
    for _ in range(tries):
        channel = conn.channel()
        try:
            if channel.basic_get(queue, no_ack=False) is None:
                return deliveries
            deliveries += 1
        finally:
            channel.close()  # unacked: the broker takes it back, counting a delivery on a quorum queue
    return deliveries


def test_a_plain_quorum_queue_drops_a_message_after_the_releases_default_delivery_limit(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        channel = conn.channel()
        channel.queue_declare("plain.quorum", durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
        channel.basic_publish(channel.prepare_message(b"poison"), exchange="", routing_key="plain.quorum")
        deliveries = hand_back_until_gone(conn, "plain.quorum")
    if broker_release() >= (4, 0):
        assert deliveries == 21, "4.0-4.2: a default delivery limit of 20 (measured on 4.0.5)"
    else:
        assert deliveries == TRIES, "3.x: no default delivery limit"


def test_the_quorum_control_queue_parks_a_message_that_spent_its_delivery_limit(fresh_vhost: str) -> None:
    """Relays that crash while holding a message spend its deliveries; past the limit it is parked, not lost."""
    limit = 3
    rabbitmqctl("set_policy", "-p", fresh_vhost, "--apply-to", "queues", "ladder-delivery-limit",
                f"^{CONTROL.replace('.', '[.]')}$", json.dumps({"delivery-limit": limit}))
    with Connection(vhost_url(fresh_vhost)) as conn:
        declare(conn, queue_type="quorum")
        wait_for(lambda: _policy_of(fresh_vhost, CONTROL) == "ladder-delivery-limit", 10,
                 message="the delivery-limit policy on the control queue")
        channel = conn.channel()
        channel.basic_publish(channel.prepare_message(b"held by crashing relays", headers={"n": 1}),
                              exchange="", routing_key=CONTROL)
        deliveries = hand_back_until_gone(conn, CONTROL)
        assert deliveries == limit + 1
        parked = wait_for(lambda: _depth(conn, PARKING), 10, message="the message in the parking queue")
        assert parked == 1
        ((reason, count),) = parked_reasons(conn)
    assert count == 1 and reason.startswith("delivery_limit:") and CONTROL in reason, reason


def _policy_of(vhost: str, queue: str) -> Any:
    rows = json.loads(rabbitmqctl("list_queues", "-p", vhost, "name", "policy", "--formatter", "json") or "[]")
    return next((row["policy"] for row in rows if row["name"] == queue), None)


def _depth(conn: Connection, queue: str) -> int:
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue, passive=True)[1])
    finally:
        channel.close()
