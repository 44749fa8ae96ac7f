"""Done-when for Kombu: a cancel survives a relay killed with SIGKILL; the relay started next enforces it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from backends import Arrivals, RabbitBackend, declare_target, depth
from faults.faultkit import Restartable
from helpers import wait_for
from kombu import Connection

from kombu_ladder import Scheduler, declare
from kombu_ladder.contract import CONTROL, rung_names

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


class RelayProcess(Restartable):
    """``python -m kombu_ladder relay`` as a subprocess, one log per start."""

    def __init__(self, url: str, logdir: Path) -> None:
        super().__init__()
        self.url, self.logdir = url, logdir

    def log_path(self, start: int) -> Path:
        return self.logdir / f"relay-{start}.log"

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path(self.starts), "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kombu_ladder", "--log-level", "INFO", "--broker", self.url, "relay"],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def log_of(self, start: int) -> str:
        return self.log_path(start).read_text(errors="replace")


@pytest.fixture
def relay(broker_url: str, tmp_path: Path) -> Iterator[RelayProcess]:
    process = RelayProcess(broker_url, tmp_path)
    try:
        yield process
    finally:
        process.stop()


def _consumers(conn: Connection, queue: str) -> int:
    return int(conn.default_channel.queue_declare(queue=queue, passive=True)[2])


def test_a_cancel_outlives_a_relay_killed_with_sigkill(broker_url: str, relay: RelayProcess) -> None:
    backend = RabbitBackend(broker_url)
    with backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.restart")
        relay.start()
        wait_for(lambda: _consumers(conn, CONTROL) == 1, 30, message="the first relay consuming")
        with Scheduler.on(conn, relay=False) as sched:
            doomed = sched.in_(4, b"doomed", routing_key="t.restart")
            kept = sched.in_(4, b"kept", routing_key="t.restart")
            sched.cancel(doomed)
        relay.kill9()
        relay.start()
        arrivals = Arrivals(backend, conn, "t.restart")
        (_, _, message), = arrivals.wait(1, 30)
        assert message.properties["message_id"] == kept
        wait_for(lambda: f"dropped cancelled message '{doomed}'" in relay.log_of(2), 30,
                 message="the second relay dropping the cancelled message")
        wait_for(lambda: all(depth(conn, q) == 0 for q in (CONTROL, *rung_names())), 10, message="an empty ladder")
        assert arrivals.poll() == 1
        second = relay.log_of(2)  # it read the cancellations before it took anything from the control queue
        assert 0 <= second.index(" live cancellation(s) from ladder.cancellations") < second.index("relay consuming")
