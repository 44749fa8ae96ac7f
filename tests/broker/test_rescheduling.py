"""Reschedule and run now on RabbitMQ: the same message, once, at its new time; the others untouched."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from helpers import vhost_url, wait_for
from kombu import Connection, Consumer, Queue

from kombu_ladder import Scheduler
from kombu_ladder.contract import rung_name
from kombu_ladder.peek import find

pytestmark = pytest.mark.broker

HOUR = 3600.0


def run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kombu_ladder", "--broker", url, *args], capture_output=True,
                          text=True, timeout=120)


class Collector:
    """What arrives on ``queue``: (message id, arrival time, body)."""

    def __init__(self, conn: Connection, queue: str) -> None:
        self.conn = conn
        self.seen: list[tuple[str, float, bytes]] = []
        self.consumer = Consumer(conn, [Queue(queue, durable=True)], callbacks=[self._on], accept=None)

    def _on(self, body: Any, message: Any) -> None:
        self.seen.append((message.properties.get("message_id"), time.time(), message.body))
        message.ack()

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.conn.drain_events(timeout=0.1)
            except (TimeoutError, OSError):
                pass

    def wait(self, count: int, timeout: float) -> None:
        wait_for(lambda: self.drain(0.1) or len(self.seen) >= count, timeout, message=f"{count} arrival(s)")


def test_run_now_from_the_1h_rung_and_reschedule_later_each_arrive_once(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn, Connection(url) as reader:
        Queue("moved.target", durable=True)(conn.default_channel).declare()
        with Scheduler.on(conn) as sched:
            for ident in ("a", "b", "c"):
                sched.in_(2 * HOUR, ident.encode(), routing_key="moved.target", message_id=ident,
                          headers={"tenant": 42})
            collector = Collector(reader, "moved.target")
            with collector.consumer:
                now = sched.run_now("b")
                moved = time.time()  # the move is committed when run_now returns
                assert now.found is not None and now.found.queue == rung_name(3600) and now.found.position == 2
                collector.wait(1, 5)
                ident, at, body = collector.seen[0]
                assert (ident, body) == ("b", b"b") and at - moved < 1.0, at - moved
                asked = time.time()
                later = sched.reschedule("c", 5)
                moved = time.time()
                assert later.found is not None and later.found.position == 2, "a is first, c after it"
                collector.wait(2, 20)
                ident, at, body = collector.seen[1]
                assert (ident, body) == ("c", b"c") and asked + 5.0 <= at <= moved + 6.5, (at - asked, moved - asked)
                collector.drain(1.0)
                assert [s[0] for s in collector.seen] == ["b", "c"], "once each; a still waits"
            assert [s.position for s in find(conn, "a").found] == [1]


def test_the_cli_moves_a_message_and_says_so_and_refuses_a_bad_time(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        Queue("moved.cli", durable=True)(conn.default_channel).declare()
        with Scheduler.on(conn, relay=False) as sched:
            sched.in_(2 * HOUR, b"x", routing_key="moved.cli", message_id="cli-1")
        done = run(url, "reschedule", "cli-1", "2030-01-01T00:00:00Z")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == f"moved cli-1 (message 1 of {rung_name(3600)}) into acemq.schedule.due, due at its new time"
        assert lines[2].startswith("now due 2030-01-01T00:00:00.000Z")
        missing = run(url, "run-now", "nope")
        assert missing.returncode == 1 and "nothing moved: no waiting message has the id 'nope'" in missing.stderr
        bad = run(url, "reschedule", "cli-1", "tomorrow")
        assert bad.returncode == 2 and "Invalid value for 'WHEN'" in bad.stderr
        naive = run(url, "reschedule", "cli-1", "2031-01-01T00:00:00")  # no offset: UTC, as everywhere
        assert naive.returncode == 0, naive.stderr
        assert naive.stdout.splitlines()[2].startswith("now due 2031-01-01T00:00:00.000Z"), naive.stdout
