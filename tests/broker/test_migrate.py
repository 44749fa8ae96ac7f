"""Blue-green: moving the waiting messages of one vhost's ladder to another's keeps every due time."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers import queue_depth as depth
from helpers import vhost_url, wait_for
from kombu import Connection, Exchange, Queue

from kombu_ladder import LadderProducer, Relay
from kombu_ladder.contract import CONTROL, DUE_AT, PARKED_REASON, PARKING, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from kombu_ladder.migrate import move

pytestmark = pytest.mark.broker


def fill_blue(blue: Connection) -> dict[str, int]:
    """Three waiting messages (1 h rung, 1 m rung, an expired one in the control queue) and a parked one."""
    target = Queue("moved-target", Exchange("moved", type="direct"), routing_key="moved")
    target(blue.default_channel).declare()
    producer = LadderProducer(blue.default_channel, serializer="json")
    now = time.time()
    producer.publish({"n": "long"}, exchange="moved", routing_key="moved", countdown=7200,
                     headers={"app": "kept"}, correlation_id="c-long")
    producer.publish({"n": "short"}, exchange="moved", routing_key="moved", countdown=90)
    due_now = {TARGET_EXCHANGE: "moved", TARGET_ROUTING_KEY: "moved", DUE_AT: int(now * 1000) - 1000,
               "x-schedule-content-type": "application/json"}
    producer.publish({"n": "due"}, exchange="", routing_key=CONTROL, headers=due_now)  # an expiry not yet relayed
    producer.publish(b"?", exchange="", routing_key=PARKING, headers={PARKED_REASON: "malformed: test"})
    return {"acemq.schedule.1h": 1, "acemq.schedule.1m": 1, CONTROL: 1, PARKING: 1}


def test_move_empties_blue_and_green_relay_places_each_message_by_its_due_time(
    connection: Connection, fresh_vhost: str,
) -> None:
    blue = connection
    expected = fill_blue(blue)
    wait_for(lambda: all(depth(blue, q) == n for q, n in expected.items()), 10, message="the publishes to arrive")
    with Connection(vhost_url(fresh_vhost)) as green:
        result = move(blue, green)
        assert {k: v for k, v in result.moved.items() if v} == expected
        assert result.total == 4
        for queue in expected:
            assert depth(blue, queue) == 0, f"{queue} was not emptied on blue"
        # Without a relay on green, the waiting ones sit in green's control queue, unchanged.
        assert depth(green, CONTROL) == 3
        assert depth(green, PARKING) == 1
        peek = Queue(CONTROL, no_declare=True).bind(green.default_channel)
        seen: dict[str, Any] = {}
        for _ in range(3):
            message = peek.get(no_ack=False, accept=["json"])
            seen[message.payload["n"]] = message
        assert seen["long"].headers["app"] == "kept"
        assert seen["long"].properties["correlation_id"] == "c-long"
        assert seen["long"].content_type == "application/json"
        assert "x-death" not in seen["long"].headers
        now_ms = time.time() * 1000
        assert 7_100_000 < int(seen["long"].headers[DUE_AT]) - now_ms <= 7_200_000
        assert 0 < int(seen["short"].headers[DUE_AT]) - now_ms <= 90_000
        for message in seen.values():
            message.reject(requeue=True)

        target = Queue("moved-target", Exchange("moved", type="direct"), routing_key="moved")
        target(green.default_channel).declare()
        relay = Relay(green.clone())
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        try:
            assert relay.ready.wait(30)
            wait_for(lambda: relay.counters.delivered == 1 and relay.counters.hops == 2, 30,
                     message="green's relay to deliver the due message and place the other two")
            # 2 h remaining -> the 1 h rung; 90 s -> the 1 m rung: their due times survived the move.
            assert depth(green, "acemq.schedule.1h") == 1
            assert depth(green, "acemq.schedule.1m") == 1
            delivered = Queue("moved-target", no_declare=True).bind(green.default_channel).get(
                no_ack=True, accept=["json"])
            assert delivered.payload == {"n": "due"}
        finally:
            relay.stop()
            thread.join(10)
            relay.connection.release()


def test_move_with_a_limit_leaves_the_rest_on_blue(
    connection: Connection, fresh_vhost: str,
) -> None:
    producer = LadderProducer(connection.default_channel)
    for i in range(5):
        producer.publish(f"m{i}", exchange="", routing_key="anywhere", countdown=600)
    wait_for(lambda: depth(connection, "acemq.schedule.10m") == 5, 10, message="the publishes to arrive")
    with Connection(vhost_url(fresh_vhost)) as green:
        result = move(connection, green, limit=2, include_parked=False)
        assert result.moved["acemq.schedule.10m"] == 2
        assert PARKING not in result.moved
        assert depth(connection, "acemq.schedule.10m") == 3
        assert depth(green, CONTROL) == 2


def test_move_refuses_a_bad_limit(connection: Connection) -> None:
    with pytest.raises(ValueError, match="limit"):
        move(connection, connection, limit=0)


def test_kombu_ladder_move_subcommand(
    connection: Connection, broker_url: str, fresh_vhost: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kombu_ladder.cli import main as cli

    LadderProducer(connection.default_channel).publish("y", exchange="", routing_key="q", countdown=30)
    wait_for(lambda: depth(connection, "acemq.schedule.10s") == 1, 10, message="the publish to arrive")
    green = vhost_url(fresh_vhost)
    assert cli(["--broker", broker_url, "move", "--to", green]) == 0
    assert "moved 1 message(s)" in capsys.readouterr().out
    assert depth(connection, "acemq.schedule.10s") == 0
    with Connection(green) as conn:
        assert depth(conn, CONTROL) == 1
    assert cli(["move", "--broker", broker_url, "--to", "amqp://guest:guest@127.0.0.1:1//"]) == 69
    assert capsys.readouterr().err.startswith(
        "Error: Could not connect to the message broker at amqp://guest:**@127.0.0.1:1//.")
