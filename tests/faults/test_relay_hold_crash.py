"""Fault: a relay holding messages (unacked, waiting for their due time) is killed with SIGKILL."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kombu import Connection, Queue

from kombu_ladder import declare
from kombu_ladder.contract import CONTROL

from .conftest import PrivateNode, RelayProcess
from .faultkit import Collector, ladder_depth, publish_numbered, wait_until

pytestmark = pytest.mark.broker

#: Messages scheduled 6-8 s ahead: one 1 s rung, then held by the relay for 5-7 s.
SENT = 400
TARGET = "faults.hold.target"


def _control(node: PrivateNode, vhost: str) -> tuple[int, int]:
    """(ready, unacked) messages in the control queue."""
    out = node.ctl("list_queues", "-p", vhost, "name", "messages_ready", "messages_unacknowledged",
                   "--no-table-headers")
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == CONTROL:
            return int(parts[1]), int(parts[2])
    return 0, 0


def test_relay_killed_while_holding_loses_nothing(private_node: PrivateNode, fault_vhost: str, fault_url: str,
                                                  relay_process: RelayProcess, report: dict[str, Any]) -> None:
    with Connection(fault_url) as conn:
        declare(conn)
        Queue(TARGET, durable=True)(conn.default_channel).declare()
    relay_process.start()
    with Collector(fault_url, TARGET) as collector:
        started = time.monotonic()
        publish_numbered(fault_url, SENT, lambda n: 6.0 + 2.0 * n / SENT, queue=TARGET)
        # Every message has left its 1 s rung and is held, unacked, by the relay.
        wait_until(lambda: _control(private_node, fault_vhost) == (0, SENT), 20,
                   "the relay holding every message", relay_process.log)
        held_after = time.monotonic() - started
        assert collector.unique == 0
        relay_process.kill9()
        # The broker takes the held messages back at once: ready on the control queue.
        wait_until(lambda: _control(private_node, fault_vhost) == (SENT, 0), 20,
                   "the held messages back on the control queue")
        relay_process.start()

        def settled() -> bool:
            return (collector.unique == SENT and ladder_depth(private_node.ctl, fault_vhost) == 0
                    and time.monotonic() - collector.last_at > 1.5)

        wait_until(settled, 60, "every message delivered and the ladder empty",
                   lambda: f"{collector.figures(SENT)}\n{relay_process.log()[-3000:]}")
        result = collector.figures(SENT)
    report.update(result, held_after_s=round(held_after, 1), total_s=round(time.monotonic() - started, 1))
    assert result["lost"] == 0
    assert result["delivered"] == SENT
    assert result["duplicated"] == 0, result  # nothing held had been published before the kill
