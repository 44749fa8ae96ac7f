"""A rolling restart of a relay holding messages on a quorum control queue with a delivery limit of 3 loses
nothing: a clean stop never requeues a held message (issue 28, item 3).

Each requeue counts one delivery on a quorum queue; three clean stops used to spend a held message's
limit, and it was dead-lettered though nothing ever failed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from faults.faultkit import Collector
from helpers import list_queues, queue_depth, rabbitmqctl, vhost_url, wait_for
from kombu import Connection, Queue

from kombu_ladder import LadderProducer, declare
from kombu_ladder.contract import CONTROL, PARKING

pytestmark = pytest.mark.broker

SENT = 300
RESTARTS = 5
LIMIT = 3
TARGET = "t.rolling.target"
ROOT = Path(__file__).resolve().parents[2]


class RelayProcess:
    """``kombu-ladder relay --queue-type quorum`` in a subprocess, stopped with SIGTERM; it holds the last 30 s
    of a delay, so a held message sees every restart."""

    def __init__(self, url: str, logdir: Path) -> None:
        self.url, self.logdir, self.starts = url, logdir, 0
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> None:
        self.starts += 1
        with open(self.logdir / f"relay-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kombu_ladder", "--log-level", "INFO", "--broker", self.url, "relay",
                 "--queue-type", "quorum", "--report-every", "2", "--hold-window", "30"],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def taken(self) -> bool:
        """Whether the relay of the latest start has taken messages (its counters, logged every 2 s)."""
        text = (self.logdir / f"relay-{self.starts}.log").read_text(errors="replace")
        return re.search(r"'received': [1-9]", text) is not None

    def log(self) -> str:
        return "\n".join((self.logdir / f"relay-{n}.log").read_text(errors="replace")
                         for n in range(1, self.starts + 1))

    def terminate(self) -> float:
        """SIGTERM; wait for the exit; return how long the clean stop took (seconds)."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        assert self.proc.returncode == 0, self.log()[-3000:]
        return time.monotonic() - started

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_a_rolling_restart_of_a_holding_relay_on_a_quorum_control_queue_with_delivery_limit_3_loses_nothing(
        fresh_vhost: str, tmp_path: Path) -> None:
    rabbitmqctl("set_policy", "-p", fresh_vhost, "--apply-to", "queues", "ladder-delivery-limit",
                f"^{CONTROL.replace('.', '[.]')}$", json.dumps({"delivery-limit": LIMIT}))
    url = vhost_url(fresh_vhost)
    relay = RelayProcess(url, tmp_path)
    stops: list[float] = []
    with Connection(url) as conn:
        declare(conn, queue_type="quorum")
        Queue(TARGET, durable=True)(conn.default_channel).declare()
        wait_for(lambda: list_queues(fresh_vhost, "policy").get(CONTROL, {}).get("policy") == "ladder-delivery-limit",
                 10, message="the delivery-limit policy on the control queue")
        relay.start()
        try:
            with Collector(url, TARGET) as collector:
                producer = LadderProducer(conn.default_channel, serializer="json", queue_type="quorum")
                for n in range(SENT):  # due 6 to 40 s ahead: every restart finds messages held
                    producer.publish({"n": n}, routing_key=TARGET, countdown=6 + 34 * n / SENT, message_id=str(n))
                for _ in range(RESTARTS):
                    wait_for(relay.taken, 20, message="the relay taking messages")
                    stops.append(relay.terminate())
                    relay.start()

                def settled() -> bool:
                    return collector.unique == SENT and time.monotonic() - collector.last_at > 1.5

                wait_for(settled, 90, message=f"every message delivered: {collector.figures(SENT)}")
                figures = collector.figures(SENT)
                parked = queue_depth(conn, PARKING)
        finally:
            relay.kill()
    log = relay.log()
    print(f"\nrolling restart, delivery-limit {LIMIT}: {figures}, parked {parked}, "
          f"stops took {', '.join(f'{s:.1f}' for s in stops)} s")
    assert log.count("put back into the ladder's rungs") >= RESTARTS - 1, "the restarts found no messages held"
    assert figures["lost"] == 0 and parked == 0, figures
    assert figures["duplicated"] == 0, figures
    assert max(stops) < 30
