"""check, find and status --due: health in one line, a waiting message found with its queue left as it was."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any, Iterator

import pytest
from helpers import celery_ladder_cli, drain, list_queues, vhost_url, wait_for
from kombu import Connection

from kombu_ladder import LadderProducer, declare
from kombu_ladder import cancel as kombu_cancel
from kombu_ladder.contract import CONTROL, PARKING, rung_name, rung_names
from kombu_ladder.depths import QueueDepth
from kombu_ladder.health import queue_findings
from kombu_ladder.peek import find, peek
from kombu_ladder.plan import due_bounds, due_window
from kombu_ladder.relay import Relay


def run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kombu_ladder", "--broker", url, *args], capture_output=True,
                          text=True, timeout=120)


# -- pure ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("queue,window", [
    ("acemq.schedule.1s", 10), ("acemq.schedule.10s", 60), ("acemq.schedule.1m", 600),
    ("acemq.schedule.10m", 3600), ("acemq.schedule.1h", None), (CONTROL, None),
])
def test_a_rungs_messages_fall_due_before_the_next_longer_rungs_ttl(queue: str, window: Any) -> None:
    assert due_window(queue) == window


def test_due_bounds_from_depths() -> None:
    depths = {"acemq.schedule.1h": 1204, "acemq.schedule.10m": 87, "acemq.schedule.1m": 12,
              "acemq.schedule.10s": 3, "acemq.schedule.1s": 1, CONTROL: 2}
    rows = [(b.label, b.at_least, b.at_most) for b in due_bounds(depths)]
    assert rows == [("1 minute", 4, 1309), ("1 hour", 103, 1309), ("1 day", 103, 1309),
                    ("more than 1 day", 0, 1206)]
    assert [(b.at_least, b.at_most) for b in due_bounds({})] == [(0, 0)] * 4


def rows(control: tuple[int, int], parked: int = 0) -> list[QueueDepth]:
    return [QueueDepth(CONTROL, *control), QueueDepth(PARKING, parked, 0)]


@pytest.mark.parametrize("depths,options,failed", [
    (rows((0, 1)), {}, []),
    (rows((0, 0)), {}, ["no relay consumes acemq.schedule.due"]),
    (rows((0, 1)), {"min_relays": 2}, ["1 relay(s) consume acemq.schedule.due, fewer than 2"]),
    (rows((0, 0)), {"min_relays": 0}, []),
    (rows((999, 3)), {}, []),
    (rows((1000, 3)), {}, ["1000 message(s) wait in acemq.schedule.due, not under 1000: the relays do not keep up"]),
    (rows((5, 3)), {"max_backlog": 5}, ["5 message(s) wait in acemq.schedule.due, not under 5: the relays do not "
                                        "keep up"]),
    (rows((0, 1), parked=4), {"max_parked": 3}, ["4 message(s) are parked in acemq.schedule.parked, more than 3"]),
    (rows((0, 1), parked=3), {"max_parked": 3}, []),
    (rows((0, 1), parked=4), {}, []),  # parked is only checked when asked
])
def test_queue_findings(depths: list[QueueDepth], options: dict[str, int], failed: list[str]) -> None:
    assert [f.detail for f in queue_findings(depths, **options) if not f.ok] == failed


# -- check ---------------------------------------------------------------------------------------------

@pytest.fixture
def relay_in(request: pytest.FixtureRequest) -> Iterator[Any]:
    started: list[tuple[Relay, threading.Thread, Connection]] = []

    def start(url: str) -> Relay:
        conn = Connection(url)
        relay = Relay(conn)
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        assert relay.ready.wait(30), "the relay did not start consuming"
        started.append((relay, thread, conn))
        return relay

    yield start
    for relay, thread, conn in started:
        relay.stop()
        thread.join(30)
        conn.release()


@pytest.mark.broker
def test_check_fails_without_a_relay_and_passes_with_one(fresh_vhost: str, relay_in: Any) -> None:
    url = vhost_url(fresh_vhost)
    undeclared = run(url, "check")
    assert (undeclared.returncode, undeclared.stdout) == (1, "")
    assert undeclared.stderr == "Error: ladder unhealthy: the ladder is not declared (run 'kombu-ladder declare')\n"
    assert list_queues(fresh_vhost) == {}, "check creates nothing"
    with Connection(url) as conn:
        declare(conn)
    no_relay = run(url, "check")
    assert (no_relay.returncode, no_relay.stderr) == (1, "Error: ladder unhealthy: no relay consumes "
                                                         "acemq.schedule.due\n")
    relay_in(url)
    ok = run(url, "check")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == ("ok: topology as the contract says; 1 relay(s) consuming; backlog 0 (under 1000); "
                         "the control plane is declared, ladder.cancellations included\n")
    report = json.loads(run(url, "check", "--json").stdout)
    assert report["ok"] is True and [c["check"] for c in report["checks"]] == ["topology", "relays", "backlog",
                                                                              "cancellations"]


@pytest.mark.broker
def test_check_names_a_queue_declared_against_the_contract_and_changes_nothing(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
        channel = conn.channel()
        channel.queue_delete(rung_name(1))
        channel.queue_declare(rung_name(1), durable=True, auto_delete=False, arguments={"x-message-ttl": 2000})
        channel.queue_delete(PARKING)
        channel.close()
    done = run(url, "check", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False
    (line,) = done.stderr.splitlines()
    assert line.startswith("Error: ladder unhealthy: acemq.schedule.parked missing (run 'kombu-ladder declare'); "
                           "acemq.schedule.1s exists with settings other than the contract's: PRECONDITION_FAILED - "
                           "inequivalent arg 'x-message-ttl'"), line
    assert line.endswith("; no relay consumes acemq.schedule.due"), line
    queues = list_queues(fresh_vhost)
    assert queues[rung_name(1)]["arguments"] == {"x-message-ttl": 2000} and PARKING not in queues


@pytest.mark.broker
def test_celery_ladder_check_uses_the_apps_broker(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
    done = celery_ladder_cli(url, "check")
    assert (done.returncode, done.stderr) == (1, "Error: ladder unhealthy: no relay consumes acemq.schedule.due\n")
    assert celery_ladder_cli(url, "check", "--min-relays", "0").returncode == 0


# -- find ----------------------------------------------------------------------------------------------

def drain_ids(conn: Connection, queue: str) -> list[str]:
    return [message.properties["message_id"] for message in drain(conn, queue)]


@pytest.mark.broker
def test_find_shows_the_rung_and_due_time_and_leaves_the_queue_as_it_was(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    rung = rung_name(600)
    with Connection(url) as conn:
        producer = LadderProducer(conn.default_channel)
        published = [f"m-{i}" for i in range(2000)]
        for ident in published:  # 40 min ahead: the 10m rung
            producer.publish(b"w", exchange="billing", routing_key="invoice.due", countdown=2400, message_id=ident)
        wait_for(lambda: peek(conn, rung, lambda p, m: False, limit=1)[1] == 2000, 30, message="2000 in the rung")
        done = run(url, "find", "m-1500")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == f"{rung}: message 1501 of 2000"
        assert lines[1] == "state   waiting"  # no cancellation was ever recorded here: the stream does not exist
        assert lines[2].startswith("due     ") and ", in 23" in lines[2]
        assert lines[3] == "target  exchange 'billing', routing key 'invoice.due'"
        assert lines[4].startswith("looked at 1501 message(s) in ")  # the 1h rung is empty; it stops at the match
        result = find(conn, "m-7", first=False)
        assert [(s.queue, s.position) for s in result.found] == [(rung, 8)] and not result.truncated
        missing = run(url, "find", "nope", "--limit", "10")
        assert missing.returncode == 1
        assert missing.stderr == ("Error: no waiting message has the id 'nope': looked at 10 message(s) in the rungs, "
                                  "acemq.schedule.due and acemq.schedule.parked (stopped at --limit 10); it may be "
                                  "delivered already, or at a relay on its way to its next queue\n")
        assert drain_ids(conn, rung) == published, "every message is back, in its order"


@pytest.mark.broker
def test_find_shows_a_cancelled_message_that_still_waits_as_cancelled(fresh_vhost: str) -> None:
    """Issue 40: the scan showed a cancelled message as if it would be delivered (``waiting find`` said cancelled)."""
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
        producer = LadderProducer(conn.default_channel)
        producer.publish(b"w", routing_key="t.find", countdown=7200, message_id="keep-me")
        producer.publish(b"w", routing_key="t.find", countdown=7200, message_id="drop-me")
        producer.publish(b"[[], {}, {}]", routing_key="t.find", countdown=7200, correlation_id="task-1",
                         headers={"task": "billing.send_invoice", "id": "task-1"})
        kombu_cancel(conn, "drop-me")
        kombu_cancel(conn, "task-1")
    for ident, state in (("keep-me", "waiting"), ("drop-me", "cancelled"), ("task-1", "cancelled")):
        done = run(url, "find", ident)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[1] == f"state   {state}", done.stdout
        as_json = run(url, "find", ident, "--json")
        assert [s["state"] for s in json.loads(as_json.stdout)["found"]] == [state]
    assert celery_ladder_cli(url, "show", "task-1").stdout.splitlines()[1] == "state   cancelled"


@pytest.mark.broker
def test_a_scan_right_after_a_scan_sees_every_message(fresh_vhost: str) -> None:
    """A scan hands its messages back before it returns: a read at once, or the next scan, sees them all.

    Closing the scan's channel alone left the queue short for a moment (the queue learns of
    the close after the channel has answered it): 7 reads in 600 on RabbitMQ 4.0 under load,
    and a reschedule then missed its message.
    """
    rung = rung_name(3600)
    with Connection(vhost_url(fresh_vhost)) as conn:
        producer = LadderProducer(conn.default_channel)
        for n in range(100):
            producer.publish(b"w", routing_key="t.scans", countdown=7200, message_id=f"s-{n}")
        wait_for(lambda: peek(conn, rung, lambda p, m: False, limit=1)[1] == 100, 30, message="100 in the 1h rung")
        reader = conn.channel()  # open already: it reads the depth the moment a scan returns
        short = []
        for scan in range(300):
            looked_at, _ = peek(conn, rung, lambda p, m: False, limit=1000)
            after = int(reader.queue_declare(rung, passive=True)[1])
            if (looked_at, after) != (100, 100):
                short.append((scan, looked_at, after))
        assert short == [], "scans after which the rung was short of the messages they gave back"


@pytest.mark.broker
def test_status_due_bounds_what_falls_due(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        producer = LadderProducer(conn.default_channel)
        for countdown in (30, 30, 300, 2 * 86400):  # the 10s rung twice, the 1m rung, the 1h rung
            producer.publish(b"w", exchange="", routing_key="q", countdown=countdown)
    done = run(url, "status", "--due", "--json")
    assert done.returncode == 0, done.stderr
    due = {row["label"]: (row["at_least"], row["at_most"]) for row in json.loads(done.stdout)["due"]}
    assert due == {"1 minute": (2, 4), "1 hour": (3, 4), "1 day": (3, 4), "more than 1 day": (0, 1)}
    table = run(url, "status", "--due").stdout
    assert "falls due within    at least   at most\n1 minute                   2         4\n" in table
    assert set(rung_names()) <= {row.split()[0] for row in table.splitlines() if row.startswith("acemq")}
