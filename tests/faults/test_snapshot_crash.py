"""Fault: a relay is killed with SIGKILL while it writes a snapshot (some parts out, no seal); the relay started
next loads the previous complete snapshot, reads the records after it, and drops every cancelled message."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from kombu import Connection

from kombu_ladder.cancellation.stream import cancel_many
from kombu_ladder.relay.cancelwatch import HOLD_AFTER_PARTS

from .conftest import PrivateNode, RelayProcess
from .faultkit import Collector, declare_ladder, ladder_depth, publish_numbered, wait_until

pytestmark = pytest.mark.broker

SENT = 60
TARGET = "faults.snapshot.target"
#: Every third message is cancelled: those before the first snapshot, and those after it.
EARLY = [n for n in range(SENT) if n % 3 == 0]
LATE = [n for n in range(SENT) if n % 3 == 1]
#: Seconds the messages wait: in the 1 m rung, so that no relay sees one before the last relay has started.
DELAY = 68.0
#: A snapshot at every record, in parts of 4 cancellations: the second snapshot (40 live) has 10 parts.
POLICY = {"LADDER_SNAPSHOT_RECORDS": "1", "LADDER_SNAPSHOT_SPACING_SECONDS": "0", "LADDER_SNAPSHOT_PART_ENTRIES": "4"}

WROTE = re.compile(r"wrote snapshot (\w+) to ladder\.snapshots")


def _log(relay: RelayProcess, start: int) -> str:
    return relay.log_path(start).read_text(errors="replace") if relay.log_path(start).exists() else ""


def test_a_relay_killed_while_writing_a_snapshot(private_node: PrivateNode, fault_vhost: str, fault_url: str,
                                                 relay_process: RelayProcess, monkeypatch: pytest.MonkeyPatch,
                                                 report: dict[str, Any]) -> None:
    declare_ladder(fault_url, TARGET)
    for name, value in POLICY.items():
        monkeypatch.setenv(name, value)
    publish_numbered(fault_url, SENT, lambda n: DELAY, queue=TARGET, pipelined=True)
    started = time.monotonic()
    with Connection(fault_url) as conn:
        cancel_many(conn, [str(n) for n in EARLY])
    # The first relay reads the early cancellations back (no snapshot yet) and writes the first snapshot.
    relay_process.start()
    wait_until(lambda: WROTE.search(_log(relay_process, 1)), 30, "the first snapshot", relay_process.log)
    first = WROTE.search(_log(relay_process, 1)).group(1)  # type: ignore[union-attr]
    relay_process.stop()
    with Connection(fault_url) as conn:
        cancel_many(conn, [str(n) for n in LATE])
    # The second relay loads it, reads the late cancellations, and begins the second snapshot: it is killed
    # after two of its parts are confirmed, before the seal.
    monkeypatch.setenv(HOLD_AFTER_PARTS, "2")
    relay_process.start()
    wait_until(lambda: "holding snapshot" in _log(relay_process, 2), 30, "the second relay mid-snapshot",
               relay_process.log)
    assert f"loaded snapshot {first}" in _log(relay_process, 2)
    relay_process.kill9()
    monkeypatch.delenv(HOLD_AFTER_PARTS)
    relay_process.start()
    wait_until(lambda: "relaying" in _log(relay_process, 3), 30, "the third relay caught up", relay_process.log)
    third = _log(relay_process, 3)
    assert f"loaded snapshot {first}" in third, third  # the unsealed one is ignored
    assert time.monotonic() - started < DELAY - 5, "the third relay started before any message left its rung"
    with Collector(fault_url, TARGET) as collector:
        def settled() -> bool:
            return ladder_depth(private_node.ctl, fault_vhost) == 0 and time.monotonic() - collector.last_at > 1.5

        wait_until(settled, DELAY + 60, "every message delivered or dropped", relay_process.log)
        cancelled = set(EARLY) | set(LATE)
        kept = [n for n in range(SENT) if n not in cancelled]
        delivered_cancelled = sorted(n for n in collector.seen if n in cancelled)
        result = {"sent": SENT, "delivered": collector.unique, "duplicated": collector.total - collector.unique,
                  "lost": sum(1 for n in kept if n not in collector.seen)}
    report.update(result, cancelled=len(cancelled), delivered_cancelled=len(delivered_cancelled))
    assert delivered_cancelled == []
    assert result["lost"] == 0 and result["delivered"] == len(kept)
    assert len(re.findall("dropped cancelled message", relay_process.log())) == len(cancelled)
