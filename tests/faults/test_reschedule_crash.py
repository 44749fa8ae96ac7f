"""Fault: a relay is killed with SIGKILL while it holds messages an operator rescheduled: each arrives once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kombu import Connection

from kombu_ladder.contract import rung_name
from kombu_ladder.rescheduling import reschedule

from .conftest import PrivateNode, RelayProcess
from .faultkit import (
    Collector,
    control_counts,
    declare_ladder,
    ladder_depth,
    publish_numbered,
    wait_delivered,
    wait_until,
)

pytestmark = pytest.mark.broker

SENT = 100
TARGET = "faults.moved.target"
#: Seconds from the first move to the new due time: the moves, then a relay holding every copy.
AHEAD = 25.0


def test_rescheduled_messages_arrive_once_across_a_relay_kill(private_node: PrivateNode, fault_vhost: str,
                                                              fault_url: str, relay_process: RelayProcess,
                                                              report: dict[str, Any]) -> None:
    """100 messages wait in the 1h rung and are moved to one new due time; a relay takes the copies, holds them
    and is killed; another starts: every message arrives once, not before its new time, none from the rung."""
    declare_ladder(fault_url, TARGET)
    publish_numbered(fault_url, SENT, lambda n: 7200.0, queue=TARGET)
    with Collector(fault_url, TARGET) as collector:
        due = time.time() + AHEAD
        with Connection(fault_url) as conn:
            moved = [reschedule(conn, str(n), due - time.time()).found for n in range(SENT)]
        misplaced = {n: sighting for n, sighting in enumerate(moved)
                     if sighting is None or sighting.queue != rung_name(3600)}
        assert not misplaced, f"not moved from the 1h rung: {misplaced}"
        assert ladder_depth(private_node.ctl, fault_vhost) == SENT, "the copies, and no original left"
        # Within the relay's 10 s hold window of the new due time: it holds every copy, unacked.
        while time.time() < due - 9.0:
            time.sleep(0.05)
        relay_process.start()
        wait_until(lambda: control_counts(private_node, fault_vhost) == (0, SENT), due - time.time() - 1.0,
                   "the relay holding every copy", relay_process.log)
        relay_process.kill9()
        relay_process.start()
        while time.time() < due - 0.2:
            assert collector.unique == 0, "never before the new due time"
            time.sleep(0.05)

        result = wait_delivered(collector, private_node, fault_vhost, SENT, 60, relay_process.log)
    report.update(result)
    assert result["lost"] == 0 and result["delivered"] == SENT
    assert result["duplicated"] == 0, result  # neither the original and the copy, nor a copy twice
