"""Bad and hostile input on a real broker: malformed storms, unroutable targets, the allow-list, replay."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional

import pytest
from helpers import queue_depth as depth
from helpers import wait_for
from kombu import Connection, Exchange, Producer, Queue

from kombu_ladder import Relay, declare
from kombu_ladder.contract import (
    CONTROL,
    DUE_AT,
    PARKED_AT,
    PARKED_REASON,
    PARKING,
    TARGET_EXCHANGE,
    TARGET_ROUTING_KEY,
)
from kombu_ladder.envelope import scheduled_headers
from kombu_ladder.parking import parked_reasons, replay
from kombu_ladder.targets import ExchangeCheck

pytestmark = pytest.mark.broker

#: Valid and invalid messages in the storm, each.
STORM = 1000


def consumers(conn: Connection, queue: str) -> int:
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue, passive=True)[2])
    finally:
        channel.close()


def due_headers(target: str, *, exchange: str = "", due_ms: Optional[int] = None) -> dict[str, Any]:
    due = int(time.time() * 1000) - 1000 if due_ms is None else due_ms
    return scheduled_headers({"app": "kept"}, exchange=exchange, routing_key=target, due_at=due,
                             content_type="application/json")


def without(key: str) -> Callable[[str], dict[str, Any]]:
    def make(target: str) -> dict[str, Any]:
        headers = due_headers(target)
        del headers[key]
        return headers
    return make


def with_(key: str, value: Any) -> Callable[[str], dict[str, Any]]:
    def make(target: str) -> dict[str, Any]:
        return {**due_headers(target), key: value}
    return make


#: Every kind of invalid expiry: (name, headers for a given target queue, or None for no headers).
INVALID: list[tuple[str, Callable[[str], Optional[dict[str, Any]]]]] = [
    ("no headers", lambda target: None),
    ("due-at missing", without(DUE_AT)),
    ("due-at non-numeric", with_(DUE_AT, "soon")),
    ("due-at boolean", with_(DUE_AT, True)),
    ("due-at float string", with_(DUE_AT, "1700000000000.5")),
    ("due-at float", with_(DUE_AT, 1.7e12)),
    ("due-at negative", with_(DUE_AT, -5)),
    ("due-at huge", with_(DUE_AT, 10**15)),
    ("target exchange missing", without(TARGET_EXCHANGE)),
    ("routing key missing", without(TARGET_ROUTING_KEY)),
    ("exchange not a string", with_(TARGET_EXCHANGE, 42)),
    ("routing key not a string", with_(TARGET_ROUTING_KEY, [1, 2])),
    ("empty routing key on the default exchange", with_(TARGET_ROUTING_KEY, "")),
]


def put_expired(producer: Producer, body: Any, headers: Optional[dict[str, Any]]) -> None:
    """Put one message straight on the control queue, as if a rung had just expired it."""
    producer.publish(body, exchange="", routing_key=CONTROL, serializer="json", delivery_mode=2,
                     headers=headers)


@pytest.fixture
def relay_factory(connection: Connection) -> Iterator[Callable[..., Relay]]:
    """Start in-process relays on their own connections; stop them after the test.

    The ladder is declared first, so messages put on the control queue before a
    relay starts are not dropped.
    """
    declare(connection)
    running: list[tuple[Relay, threading.Thread]] = []

    def start(**options: Any) -> Relay:
        relay = Relay(connection.clone(), **options)
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        assert relay.ready.wait(20), "the relay did not start"
        running.append((relay, thread))
        return relay

    yield start
    for relay, thread in running:
        relay.stop()
        thread.join(10)
        relay.connection.release()


def parked_messages(conn: Connection, limit: int) -> list[Any]:
    """Look at up to ``limit`` parked messages (they go back when the channel closes)."""
    channel = conn.channel()
    out = []
    try:
        for _ in range(limit):
            message = channel.basic_get(PARKING, no_ack=False)
            if message is None:
                break
            out.append(message)
    finally:
        channel.close()
    return out


def test_malformed_storm_parks_every_invalid_message_and_delivers_every_valid_one(
    connection: Connection, broker_url: str, relay_factory: Callable[..., Relay],
) -> None:
    target = "hostile.storm.target"
    Queue(target, durable=False, auto_delete=False)(connection.default_channel).declare()
    connection.default_channel.queue_purge(target)
    producer = Producer(connection.default_channel)
    kinds = itertools.cycle(INVALID)
    for n in range(STORM):
        put_expired(producer, {"n": n}, due_headers(target))
        _, make = next(kinds)
        put_expired(producer, {"bad": n}, make(target))
    relay = relay_factory()
    wait_for(lambda: depth(connection, target) == STORM and depth(connection, PARKING) == STORM, 60,
             message="the storm to be delivered and parked")
    # counted once confirmed, which may come after the queues show the messages
    wait_for(lambda: relay.counters.parked == STORM and relay.counters.delivered == STORM, 10,
             message="the relay counters")
    assert relay.counters.malformed == STORM
    assert depth(connection, CONTROL) == 0

    parked = parked_messages(connection, STORM)
    assert len(parked) == STORM
    for message in parked:
        assert message.headers[PARKED_REASON].startswith("malformed: ")
        assert isinstance(message.headers[PARKED_AT], int)
        assert "bad" in json.loads(message.body)
    reasons = dict(parked_reasons(connection, limit=STORM))
    assert sum(reasons.values()) == STORM
    assert any("is missing" in r for r in reasons) and any("negative" in r for r in reasons)

    status = subprocess.run([sys.executable, "-m", "kombu_ladder", "--broker", broker_url, "status"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    row = next(line for line in status.splitlines() if line.startswith(PARKING))
    assert row.split()[1] == str(STORM)
    assert "why they are parked" in status and "malformed: header x-schedule-due-at" in status


@pytest.mark.parametrize("missing", ["binding", "exchange"])
def test_unroutable_delivery_is_parked_then_replayed_once_the_route_exists(
    missing: str, connection: Connection, broker_url: str, relay_factory: Callable[..., Relay],
) -> None:
    exchange_name = f"hostile.unroutable.{missing}"
    target = f"hostile.unroutable.{missing}.q"
    exchange = Exchange(exchange_name, type="direct", durable=False, auto_delete=False)
    channel = connection.default_channel
    if missing == "binding":
        exchange(channel).declare()
    else:
        exchange(channel).delete()
    Queue(target, durable=False)(channel).delete()
    producer = Producer(channel)
    for n in range(3):
        put_expired(producer, {"n": n}, due_headers("the-key", exchange=exchange_name))
    relay = relay_factory()
    wait_for(lambda: depth(connection, PARKING) == 3, 20, message="the unroutable messages parked")
    for message in parked_messages(connection, 3):
        assert message.headers[PARKED_REASON].startswith("unroutable")
        assert message.headers[TARGET_EXCHANGE] == exchange_name  # kept for the replay
        assert message.headers["app"] == "kept"
    assert relay.counters.delivered == 0

    # The operator fixes the route, then replays. The relay refuses a missing exchange without asking
    # again while messages for it keep coming (ExchangeCheck.NEGATIVE_IDLE apart): a replay is asked
    # about afresh once the relay was idle that long, as an operator's always is (this test is quicker).
    parked_at = time.monotonic()
    wait_for(lambda: time.monotonic() - parked_at > ExchangeCheck.NEGATIVE_IDLE, 5, message="the relay idle")
    exchange(channel).declare()
    Queue(target, exchange, routing_key="the-key", durable=False)(channel).declare()
    done = subprocess.run([sys.executable, "-m", "kombu_ladder", "--broker", broker_url, "replay"],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert "replayed 3 parked message(s)" in done
    wait_for(lambda: depth(connection, target) == 3, 20, message="the replayed messages delivered")
    assert depth(connection, PARKING) == 0
    delivered = [channel.basic_get(target, no_ack=True) for _ in range(3)]
    assert sorted(json.loads(m.body)["n"] for m in delivered) == [0, 1, 2]
    for message in delivered:
        assert not any(k.startswith(("x-schedule-", "x-ladder-parked")) for k in message.headers)
        assert message.headers["app"] == "kept"


def test_allow_list_parks_refused_targets_and_replay_match_selects_them(
    connection: Connection, relay_factory: Callable[..., Relay],
) -> None:
    allowed = "hostile.allowed"
    channel = connection.default_channel
    exchange = Exchange(allowed, type="direct", durable=False)
    exchange(channel).declare()
    Queue("hostile.allowed.q", exchange, routing_key="k", durable=False)(channel).declare()
    channel.queue_purge("hostile.allowed.q")
    producer = Producer(channel)
    put_expired(producer, {"to": "allowed"}, due_headers("k", exchange=allowed))
    put_expired(producer, {"to": "default"}, due_headers("hostile.allowed.q"))  # "" is not listed
    put_expired(producer, {"to": "amq.topic"}, due_headers("k", exchange="amq.topic"))
    put_expired(producer, {"bad": 1}, with_(DUE_AT, "x")("k"))
    relay = relay_factory(allowed_exchanges=[allowed])
    wait_for(lambda: depth(connection, "hostile.allowed.q") == 1 and depth(connection, PARKING) == 3, 20,
             message="one delivery and three parked")
    reasons = dict(parked_reasons(connection))
    assert sum(n for r, n in reasons.items() if r.startswith("refused")) == 2
    assert relay.counters.delivered == 1

    relay.stop()  # the operator replays only what was refused; the malformed one stays parked
    wait_for(lambda: consumers(connection, CONTROL) == 0, 20, message="the relay to stop consuming")
    result = replay(connection, match="refused")
    assert (result.replayed, result.kept) == (2, 1)
    assert depth(connection, CONTROL) == 2 and depth(connection, PARKING) == 1
