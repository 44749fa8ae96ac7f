"""Blue-green: moving the waiting messages of one vhost's ladder to another's keeps every due time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from helpers import drain, temporary_vhost, vhost_url, wait_for
from helpers import queue_depth as depth
from kombu import Connection, Exchange, Queue

from kombu_ladder import LadderProducer, Relay, cancel
from kombu_ladder.contract import (
    CONTROL,
    DUE_AT,
    PARKED_REASON,
    PARKING,
    TARGET_EXCHANGE,
    TARGET_ROUTING_KEY,
    rung_names,
)
from kombu_ladder.migrate import _has_index, move

pytestmark = pytest.mark.broker


def kombu_ladder(*args: str) -> subprocess.CompletedProcess[str]:
    """``kombu-ladder ARGS`` in a process of its own, as an operator runs it (its own logging set-up)."""
    return subprocess.run([sys.executable, "-m", "kombu_ladder", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


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

    LadderProducer(connection.default_channel).publish("y", exchange="", routing_key="q", countdown=30,
                                                       message_id="moved-1")
    wait_for(lambda: depth(connection, "acemq.schedule.10s") == 1, 10, message="the publish to arrive")
    green = vhost_url(fresh_vhost)
    # the index is in use where its stream exists (an earlier test of this vhost's may have declared the control
    # plane, as a cancel with full rights does): then the move indexes what it moved on the target, and says so
    indexed = ["indexed 1 moved message(s) in the target's ladder.index (waiting find/list there after a sync)"] \
        if _has_index(connection) else []
    done = kombu_ladder("--broker", broker_url, "move", "--to", green)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["queue", "moved"], "the table has a header, as status's has"
    assert lines[1:] == [f"{name:<26} {count:>9}" for name, count in
                         [(n, 1 if n == "acemq.schedule.10s" else 0) for n in
                          (*rung_names(), CONTROL, PARKING)]] + ["moved 1 message(s)"] + indexed
    # (the session's vhost holds records other tests forged: reading them, the move warns that it skips them)
    logged = [line for line in done.stderr.splitlines() if "skipping a record in ladder." not in line]
    assert logged == [], "the result is printed once: no INFO log line repeats it on stderr"
    assert depth(connection, "acemq.schedule.10s") == 0
    with Connection(green) as conn:
        assert depth(conn, CONTROL) == 1
    # No relay runs on green yet: the message waits in green's acemq.schedule.due, and find sees it there.
    found = kombu_ladder("--broker", green, "find", "moved-1")
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[0] == f"{CONTROL}: message 1 of 1"
    assert cli(["move", "--broker", broker_url, "--to", "amqp://guest:guest@127.0.0.1:1//"]) == 69
    assert capsys.readouterr().err.startswith(
        "Error: Could not connect to the message broker at amqp://guest:**@127.0.0.1:1//.")


def test_move_carries_cancellations_and_green_never_delivers_a_message_blue_cancelled(
    rabbit_vhost: str, fresh_vhost: str,
) -> None:
    """Cancel on blue, move to green: the cancelled message is dropped by the move, its sibling moved."""
    with temporary_vhost(f"{rabbit_vhost}-blue-{os.getpid()}") as blue_vhost, \
            Connection(vhost_url(blue_vhost)) as blue, Connection(vhost_url(fresh_vhost)) as green:
        blue.default_channel.queue_declare("moved-cancel", durable=True, auto_delete=False)
        producer = LadderProducer(blue.default_channel)
        for message_id in ("mv-doomed", "mv-kept"):
            producer.publish(message_id.encode(), routing_key="moved-cancel", countdown=7200, message_id=message_id)
        producer.publish(b"task", routing_key="moved-cancel", countdown=7200, correlation_id="mv-task",
                         headers={"task": "proj.add", "id": "mv-task"})
        cancel(blue, "mv-doomed")
        cancel(blue, "mv-task")
        wait_for(lambda: depth(blue, "acemq.schedule.1h") == 3, 10, message="the publishes to arrive")
        result = move(blue, green)
        assert (result.moved["acemq.schedule.1h"], result.cancelled["acemq.schedule.1h"]) == (1, 2)
        assert depth(blue, "acemq.schedule.1h") == 0
        moved = drain(green, CONTROL)
        assert [m.properties.get("message_id") for m in moved] == ["mv-kept"]


def test_a_cancellation_written_on_the_source_during_the_move_applies_on_the_target(
        rabbit_vhost: str, fresh_vhost: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the move reads the source's cancellations again once done, and records on the target those of
    messages it moved; the target's relay then drops the message instead of delivering it."""
    import kombu_ladder.migrate as migrate
    from kombu_ladder import Scheduler, declare
    from kombu_ladder.migrate import read_cancellations

    real = migrate._move_queue

    def cancel_while_moving(source: Any, confirms: Any, name: str, *args: Any) -> int:
        count = real(source, confirms, name, *args)
        if name == "acemq.schedule.10s":  # the doomed message has been moved: cancel it on the source now
            cancel(source, "doomed")
        return count

    monkeypatch.setattr(migrate, "_move_queue", cancel_while_moving)
    with temporary_vhost(f"{rabbit_vhost}-blue-{os.getpid()}") as blue_vhost, \
            Connection(vhost_url(blue_vhost)) as blue, Connection(vhost_url(fresh_vhost)) as green:
        declare(blue)
        for conn in (blue, green):
            Queue("moved.q", durable=True)(conn.default_channel).declare()
        sender = LadderProducer(blue.default_channel)
        for message_id in ("doomed", "kept"):
            sender.publish(b"{}", exchange="", routing_key="moved.q", countdown=15, message_id=message_id)
        wait_for(lambda: depth(blue, "acemq.schedule.10s") == 2, 10, message="the publishes to arrive")
        assert not len(read_cancellations(blue))  # nothing cancelled when the move starts
        result = move(blue, green)
        assert (result.total, result.recancelled) == (2, 1)
        with Scheduler.on(green) as relay:
            wait_for(lambda: relay.delivered + relay.cancelled >= 2, 60, message="both messages settled")
            assert (relay.delivered, relay.cancelled) == (1, 1)
        assert [m.properties.get("message_id") for m in drain(green, "moved.q")] == ["kept"]
