"""A relay under a memory limit with big bodies falling due together keeps working: it delivers every
message, none early, within its byte budget (issue 28, item 1)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers import vhost_url
from kombu import Connection, Consumer, Queue

from kombu_ladder import LadderProducer, declare

pytestmark = pytest.mark.broker

#: The issue's case: 2,000 bodies of 256 KiB due 8 s ahead (the relay of 0.x peaked at 541-561 MB).
SENT = 2000
BODY = 256 * 1024
COUNTDOWN = 8.0
#: A container's memory, as an address-space limit on the relay's process.
LIMIT = 400 * 1024 * 1024
TARGET = "t.memory.target"
ROOT = Path(__file__).resolve().parents[2]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _peak_rss_mb(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


class Arrivals:
    """Consume the target queue in a thread: each message's number and when it arrived (epoch seconds)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: dict[int, list[float]] = {}
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_message(self, message: Any) -> None:
        number = int.from_bytes(message.body[:4], "big")
        self.seen.setdefault(number, []).append(time.time())
        message.ack()

    def _run(self) -> None:
        with Connection(self.url) as conn:
            with Consumer(conn, [Queue(TARGET, durable=True)], on_message=self._on_message, prefetch_count=200):
                self.ready.set()
                while not self.stop.is_set():
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass


def test_a_relay_under_a_400_mb_limit_delivers_2000_bodies_of_256_kib_none_early(fresh_vhost: str,
                                                                                tmp_path: Path) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
        Queue(TARGET, durable=True)(conn.default_channel).declare()
        log_path = tmp_path / "relay.log"
        with open(log_path, "wb") as log:
            relay = subprocess.Popen(
                [sys.executable, "-m", "kombu_ladder", "--log-level", "INFO", "--broker", url, "relay"],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limit_memory, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
        arrivals = Arrivals(url)
        arrivals.thread.start()
        peak = 0
        try:
            assert arrivals.ready.wait(20)
            deadline = time.monotonic() + 30
            while b"ladder relay consuming" not in log_path.read_bytes():
                assert relay.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.1)
            producer = LadderProducer(conn.default_channel)
            due: dict[int, float] = {}
            for n in range(SENT):
                due[n] = time.time() + COUNTDOWN  # the producer's own due time, up to the publish's microseconds
                producer.publish(n.to_bytes(4, "big") + bytes(BODY - 4), routing_key=TARGET, countdown=COUNTDOWN,
                                 content_type="application/octet-stream")
            deadline = time.monotonic() + 180
            while len(arrivals.seen) < SENT:
                peak = max(peak, _peak_rss_mb(relay.pid) or 0)
                assert relay.poll() is None, f"the relay died: {log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"{len(arrivals.seen)} of {SENT} delivered"
                time.sleep(0.2)
            peak = max(peak, _peak_rss_mb(relay.pid) or 0)
        finally:
            arrivals.stop.set()
            arrivals.thread.join(10)
            relay.terminate()
            relay.wait(30)
    early = [n for n, times in arrivals.seen.items() if min(times) < due[n]]
    copies = sum(len(times) for times in arrivals.seen.values())
    log = log_path.read_text()
    print(f"\nrelay under {LIMIT >> 20} MB: delivered {len(arrivals.seen)} of {SENT}, copies {copies}, "
          f"early {len(early)}, peak RSS {peak} MB")
    assert "MemoryError" not in log
    assert early == [], f"{len(early)} delivered before their due time"
    assert copies == SENT, "a clean run duplicates nothing"
    assert peak < LIMIT >> 20
