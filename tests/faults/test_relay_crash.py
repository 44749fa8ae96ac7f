"""Fault: a standalone relay is killed with SIGKILL mid-flight, twice, and restarted."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import pytest

from kombu_ladder.contract import PREFETCH

from .conftest import PrivateNode, RelayProcess
from .faultkit import Collector, declare_ladder, ladder_depth, publish_numbered, random_delays, wait_until

pytestmark = pytest.mark.broker

#: Messages scheduled, with delays drawn uniformly from 1-15 s.
SENT = 5000
TARGET = "faults.crash.target"


def test_relay_killed_twice_loses_nothing(private_node: PrivateNode, fault_vhost: str, fault_url: str,
                                          relay_process: RelayProcess, report: dict[str, Any]) -> None:
    seed = int(os.environ.get("LADDER_FAULT_SEED", time.time()))
    rng = random.Random(seed)
    declare_ladder(fault_url, TARGET)
    relay_process.start()
    first = rng.uniform(3.0, 10.0)
    kills = [first, first + rng.uniform(4.0, 10.0)]  # while messages are still being sent, and after
    with Collector(fault_url, TARGET) as collector:
        started = time.monotonic()
        publisher = threading.Thread(target=publish_numbered, daemon=True,
                                     args=(fault_url, SENT, random_delays(1.0, 15.0, seed)),
                                     kwargs={"queue": TARGET})
        publisher.start()
        for at in kills:
            time.sleep(max(0.0, started + at - time.monotonic()))
            assert relay_process.alive(), relay_process.log()
            relay_process.kill9()
            time.sleep(rng.uniform(0.2, 2.0))
            relay_process.start()
        publisher.join(120)
        published_in = time.monotonic() - started

        def settled() -> bool:  # quiet, whatever the outcome: the ladder empty and nothing arriving
            return ladder_depth(private_node.ctl, fault_vhost) == 0 and time.monotonic() - collector.last_at > 1.5

        wait_until(settled, 120, "every message delivered and the ladder empty",
                   lambda: f"{collector.figures(SENT)}\n{relay_process.log()[-3000:]}")
        result = collector.figures(SENT)
    report.update(result, kills=len(kills), kill_at_s=[round(k, 1) for k in kills],
                  publish_s=round(published_in, 1), seed=seed,
                  total_s=round(time.monotonic() - started, 1))
    assert result["lost"] == 0
    assert result["delivered"] == SENT
    # Each kill can duplicate the publishes waiting for their confirms, at most the prefetch, and the messages
    # whose acks were on their way (Guarantees, "Measured"): 2 x PREFETCH. Before that cap, 4.0 under CI
    # load duplicated 397 in one run.
    assert result["duplicated"] <= len(kills) * 2 * PREFETCH, result
