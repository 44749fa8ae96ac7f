"""The command line: declare, status, and a relay subprocess stopped by SIGTERM and SIGINT."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from kombu import Connection, Producer, Queue
from rabbit_helpers import list_consumers

from kombu_ladder import Scheduler
from kombu_ladder.contract import CONTROL, PARKING, rung_names

pytestmark = pytest.mark.broker

VENV_BIN = Path(sys.executable).parent


def cli(broker_url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kombu_ladder", "--broker", broker_url, *args],
                          capture_output=True, text=True, timeout=timeout)


def test_declare_prints_the_queue_names(connection: Connection, broker_url: str) -> None:
    done = cli(broker_url, "declare")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "acemq.schedule.1h", "acemq.schedule.10m", "acemq.schedule.1m", "acemq.schedule.10s",
        "acemq.schedule.1s", "acemq.schedule.due",
    ]


def status_rows(output: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in output.splitlines():
        match = re.match(r"^(acemq\.schedule\.\S+)\s+(\S+)\s+(\S+)\s*$", line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


def test_status_prints_depths_and_consumers(connection: Connection, broker_url: str) -> None:
    with Scheduler.on(connection, relay=False) as sched:
        sched.in_(3600, b"a", routing_key="t.status")
        sched.in_(7200, b"b", routing_key="t.status")
        sched.in_(30, b"c", routing_key="t.status")
    producer = Producer(connection.default_channel)
    for _ in range(3):
        producer.publish(b"p", exchange="", routing_key="acemq.schedule.parked")
    consumer_channel = connection.channel()
    Queue("acemq.schedule.due", no_declare=True).bind(consumer_channel).consume(no_ack=False)
    try:
        done = cli(broker_url, "status")
    finally:
        consumer_channel.close()
    assert done.returncode == 0, done.stderr
    rows = status_rows(done.stdout)
    assert rows == {
        "acemq.schedule.1h": ("2", "0"),
        "acemq.schedule.10m": ("0", "0"),
        "acemq.schedule.1m": ("0", "0"),
        "acemq.schedule.10s": ("1", "0"),
        "acemq.schedule.1s": ("0", "0"),
        "acemq.schedule.due": ("0", "1"),
        "acemq.schedule.parked": ("3", "0"),
    }


def test_unreachable_broker_exits_2_with_a_message() -> None:
    done = cli("amqp://guest:guest@127.0.0.1:1//", "status", timeout=60)
    assert done.returncode == 2
    assert "cannot reach the broker" in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_relay_runs_relays_and_stops_cleanly(connection: Connection, broker_url: str, rabbit_vhost: str,
                                             tmp_path: Path, signum: int) -> None:
    log = tmp_path / "relay.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kombu_ladder", "--broker", broker_url, "relay", "--report-every", "1"],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for(lambda: "relay consuming from acemq.schedule.due" in log.read_text(), 30,
                 message="the relay subprocess to start consuming")
        # Only the ladder's queues: a Celery test earlier in the session may leave a result
        # consumer (rpc:// reply queue) in the shared session vhost.
        ladder = {*rung_names(), CONTROL, PARKING}
        assert [c for c in list_consumers(rabbit_vhost) if c["queue_name"] in ladder] == [
            {"queue_name": "acemq.schedule.due", "prefetch_count": 50, "ack_required": True},
        ]
        target = Queue("t.cli", durable=True).bind(connection.default_channel)
        target.declare()
        target.purge()
        with Scheduler.on(connection, relay=False) as sched:
            sched.in_(1.2, b"via the cli relay", routing_key="t.cli")
        message: Any = wait_for(lambda: target.get(no_ack=True), 20, message="the relayed message")
        assert message.body == b"via the cli relay"
        wait_for(lambda: "'delivered': 1" in log.read_text(), 10, message="a periodic counters line")
        started = time.monotonic()
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == 0, log.read_text()
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert f"received {signal.Signals(signum).name}, stopping the relay" in text
    assert re.search(r"relay stopped: \{'received': 1, 'delivered': 1, 'hops': 0, 'malformed': 0, 'parked': 0, "
                     r"'refused': 0\}", text), text
    assert "Traceback" not in text


def test_console_script_is_installed() -> None:
    script = VENV_BIN / "kombu-ladder"
    assert script.exists(), f"{script} is missing: is the package installed (pip install -e .)?"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for word in ("declare", "relay", "status", "--broker"):
        assert word in done.stdout
