"""A SIGTERM at each moment of a standalone relay's life is a clean stop: 0 lost, 0 duplicated (issue 36).

A quick rolling restart duplicated messages only on a loaded machine, where the signal landed while the
relay was still starting. Here the relay itself waits at each phase (``LADDER_RELAY_PAUSE_AT``: it logs
that it paused and waits for the next signal), so the signal lands exactly there, whatever the load:
before its signal handlers exist (the default action ends it: exit by SIGTERM, nothing taken), connected
and declared but not consuming, reading the cancellations before it consumes, holding messages, and
putting them back as it stops (a second SIGTERM then). A second relay then delivers what is left; once it
has stopped cleanly too and every ladder queue is empty, the target queue holds each message once.
Runs on whichever broker the session uses (3.10, and 4.3 in CI's 4.3 lane).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

import pytest
from helpers import queue_depth, vhost_url, wait_for
from kombu import Connection, Queue

from kombu_ladder import LadderProducer, declare
from kombu_ladder.contract import PARKING
from kombu_ladder.relay.driver import PAUSE_AT

pytestmark = pytest.mark.broker

SENT = 20
TARGET = "t.stop-phases.target"
ROOT = Path(__file__).resolve().parents[2]


class RelayProcess:
    """``kombu-ladder relay`` in a subprocess, pausing at the given phases."""

    def __init__(self, url: str, log: Path, queue_type: str, pause: str = "") -> None:
        self.log_path = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kombu_ladder", "--log-level", "INFO", "--broker", url, "relay",
                 "--queue-type", queue_type, "--report-every", "1", "--hold-window", "30"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), PAUSE_AT: pause})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def paused_at(self, phase: str) -> None:
        wait_for(lambda: f"relay paused at {phase} " in self.log() or self.proc.poll() is not None, 60,
                 message=f"the relay pausing at {phase}", on_timeout=lambda: self.log()[-3000:])
        assert self.proc.poll() is None, self.log()[-3000:]

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> Optional[int]:
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"the relay did not stop within 60 s of SIGTERM:\n{self.log()[-3000:]}")
        return None


@pytest.mark.parametrize("phase,queue_type", [
    ("before-signals", "classic"), ("connected", "classic"), ("catching-up", "classic"),
    ("holding", "classic"), ("putting-back", "classic"), ("holding", "quorum"), ("putting-back", "quorum"),
])
def test_a_sigterm_at_any_phase_of_a_relays_life_loses_and_duplicates_nothing(
        fresh_vhost: str, tmp_path: Path, phase: str, queue_type: str) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        ladder = declare(conn, queue_type=queue_type)
        Queue(TARGET, durable=True)(conn.default_channel).declare()
        producer = LadderProducer(conn.default_channel, serializer="json", queue_type=queue_type)
        for n in range(SENT):  # due 5 to 12 s ahead: a relay receives each from a rung and holds its last seconds
            producer.publish({"n": n}, routing_key=TARGET, countdown=5 + 7 * n / SENT, message_id=str(n))

    pause = "holding,putting-back" if phase == "putting-back" else phase
    first = RelayProcess(url, tmp_path / "relay-1.log", queue_type, pause)
    try:
        first.paused_at("holding" if phase == "putting-back" else phase)
        first.terminate()
        if phase == "putting-back":
            first.paused_at("putting-back")
            first.terminate()
        status = first.wait()
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    # Before its handlers exist the default action ends it (nothing was taken); afterwards a clean stop exits 0.
    assert status == (-signal.SIGTERM if phase == "before-signals" else 0), first.log()[-3000:]

    second = RelayProcess(url, tmp_path / "relay-2.log", queue_type)
    try:
        with Connection(url) as conn:
            wait_for(lambda: queue_depth(conn, TARGET) >= SENT, 90, message=f"{SENT} messages in {TARGET}",
                     on_timeout=lambda: second.log()[-3000:])
        second.terminate()
        assert second.wait() == 0, second.log()[-3000:]
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
    with Connection(url) as conn:  # passive declares: rabbitmqctl's counts of a quorum queue lag by seconds
        waiting = {name: depth for name in [*ladder, PARKING] if (depth := queue_depth(conn, name))}
    assert waiting == {}, f"left in the ladder after both relays stopped: {waiting}"
    seen: Counter[int] = Counter()
    with Connection(url) as conn:
        queue = Queue(TARGET)(conn.default_channel)
        while (message := queue.get(no_ack=True)) is not None:
            seen[int(message.payload["n"])] += 1
    lost = [n for n in range(SENT) if not seen[n]]
    duplicated = {n: c for n, c in seen.items() if c > 1}
    print(f"\nSIGTERM at {phase} ({queue_type}): {sum(seen.values())} delivered of {SENT}, lost {lost}, "
          f"duplicated {duplicated}")
    assert (lost, duplicated) == ([], {}), first.log()[-3000:]
