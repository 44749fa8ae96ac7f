"""Fault: the broker goes away (``stop_app``/``start_app``, or a full node restart) with messages waiting."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import PrivateNode, RelayProcess
from .faultkit import Collector, declare_ladder, ladder_depth, publish_numbered, random_delays, wait_until

pytestmark = pytest.mark.broker

#: Messages waiting in the rungs when the broker goes away.
SENT = 1000
TARGET = "faults.restart.target"


@pytest.mark.parametrize("how", ["stop_app", "restart"])
def test_standalone_relay_reconnects_after_broker_restart(
    how: str, private_node: PrivateNode, fault_vhost: str, fault_url: str,
    relay_process: RelayProcess, report: dict[str, Any],
) -> None:
    declare_ladder(fault_url, TARGET)
    relay_process.start()
    with Collector(fault_url, TARGET) as collector:
        started = time.monotonic()
        publish_numbered(fault_url, SENT, random_delays(15.0, 25.0, seed=6), queue=TARGET)
        waiting = ladder_depth(private_node.ctl, fault_vhost)
        down = time.monotonic()
        if how == "stop_app":
            private_node.stop_app()
            time.sleep(1.0)  # the broker stays down a moment, so the relay really loses it
            private_node.start_app()
        else:
            private_node.restart()
        down_s = time.monotonic() - down

        def settled() -> bool:  # quiet, whatever the outcome: the ladder empty and nothing arriving
            return ladder_depth(private_node.ctl, fault_vhost) == 0 and time.monotonic() - collector.last_at > 1.5

        wait_until(settled, 120, "every message delivered after the broker came back",
                   lambda: f"{collector.figures(SENT)}\n{relay_process.log()[-3000:]}")
        result = collector.figures(SENT)
    report.update(result, how=how, waiting_at_restart=waiting, broker_down_s=round(down_s, 1),
                  total_s=round(time.monotonic() - started, 1))
    assert waiting == SENT, "the messages should all have been waiting in the rungs when the broker went away"
    assert relay_process.alive() and relay_process.starts == 1, "the relay must reconnect by itself"
    assert result["lost"] == 0
    assert result["delivered"] == SENT
