"""The failure matrix on a private three-node cluster: classic (the contract) and quorum (replicated)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from faults.faultkit import wait_until

from kombu_ladder.contract import PREFETCH

from .clusterkit import Cluster
from .scenario import Scenario, ladder_depth, timed, try_schedule

pytestmark = [pytest.mark.broker, pytest.mark.timeout(900)]

#: Messages waiting when the rung node is stopped or the rung leader is killed (the issue's figure).
WAITING = 5000

#: Messages the quorum scenario sends, so that WAITING still wait once deliveries flow.
SENT_QUORUM = 5200

#: Seconds the rung node stays down (the probes of a producer take that long).
OUTAGE = 15.0

#: Messages in flight while a node that hosts no rung restarts.
UNDER_LOAD = 2000


def test_classic_non_rung_node_restart_under_load(cluster: Cluster, cluster_vhost: str, tmp_path: Path,
                                                  matrix_row: dict[str, Any]) -> None:
    with Scenario(cluster, cluster_vhost, tmp_path, "classic") as run:
        assert cluster.home_of(cluster_vhost, "acemq.schedule.1m") == cluster.nodes[0].name
        publish_s = run.publish(UNDER_LOAD, 8.0, 30.0, seed=17)
        wait_until(lambda: run.collector.unique > 0, 60, "deliveries to start")
        failed_at = time.monotonic()
        node = cluster.nodes[2]  # hosts no rung; one relay and half the producers were on it
        down_s = timed(node.stop)
        node.start()
        node.await_startup()
        restart_s = time.monotonic() - failed_at
        result = run.wait_all(UNDER_LOAD, 180)
        gap = run.collector.longest_gap_after(failed_at)
        alive = run.relays_alive()
    matrix_row.update(profile="classic", failure="non-rung node restart", lost=result["lost"],
                      duplicated=result["duplicated"], resume_s=gap, sent=UNDER_LOAD, publish_s=round(publish_s, 1),
                      stop_s=round(down_s, 1), restart_s=round(restart_s, 1), relays_alive=alive)
    assert result["lost"] == 0 and result["delivered"] == UNDER_LOAD
    assert alive == [True, True], "a relay whose node restarts fails over to another node"
    assert result["duplicated"] <= PREFETCH, "at most one relay's unconfirmed window is redelivered"


def test_classic_rung_node_stopped_then_restarted_with_5000_waiting(
    cluster: Cluster, cluster_vhost: str, tmp_path: Path, matrix_row: dict[str, Any],
) -> None:
    with Scenario(cluster, cluster_vhost, tmp_path, "classic") as run:
        rung_node = cluster.nodes[0]
        assert cluster.home_of(cluster_vhost, "acemq.schedule.10s") == rung_node.name
        # Due 10 s to 40 s from now: the outage below makes the first of them overdue.
        publish_s = run.publish(WAITING, 10.0, 40.0, seed=5)
        waiting = ladder_depth(cluster, cluster_vhost)
        failed_at = time.monotonic()
        rung_node.stop()
        # What users see meanwhile: a producer on a surviving node (probed until the outage has lasted
        # OUTAGE seconds), and the relays, which must stay up.
        meanwhile: list[str] = []
        while time.monotonic() - failed_at < OUTAGE:
            seen = try_schedule(cluster.nodes[1].url(cluster_vhost), "classic")
            meanwhile.append(seen or "scheduled fine")
            time.sleep(0.5)  # paces the probes; the outage itself is timed by the loop's condition
        delivered_while_down = run.collector.unique
        rung_node.start()
        rung_node.await_startup()
        back_at = time.monotonic()
        result = run.wait_all(WAITING, 240)
        resume = (min(t for t in run.collector.times if t >= back_at) - back_at) if run.collector.times else -1.0
        alive = run.relays_alive()
    matrix_row.update(profile="classic", failure="rung node restart", lost=result["lost"],
                      duplicated=result["duplicated"], resume_s=resume, sent=WAITING, waiting_at_stop=waiting,
                      publish_s=round(publish_s, 1), outage_s=round(back_at - failed_at, 1),
                      delivered_while_down=delivered_while_down, probes=len(meanwhile),
                      producer_meanwhile=meanwhile[-1] if meanwhile else "", relays_alive=alive)
    assert waiting == WAITING, "every message was waiting in the rungs when their node stopped"
    assert delivered_while_down == 0, "the rungs and the control queue were all on the stopped node"
    assert meanwhile and all("NOT_FOUND" in seen for seen in meanwhile), meanwhile
    assert result["lost"] == 0 and result["delivered"] == WAITING
    assert alive == [True, True], "the relays outlive the rung node's outage"


def test_quorum_rung_leader_kill9_with_5000_waiting(cluster: Cluster, cluster_vhost: str, tmp_path: Path,
                                                    matrix_row: dict[str, Any]) -> None:
    with Scenario(cluster, cluster_vhost, tmp_path, "quorum") as run:
        leader = cluster.home_of(cluster_vhost, "acemq.schedule.10s")
        assert leader == cluster.nodes[0].name, "declared through node 1, the rungs are led from there"
        # Mixed delays: 12 s to 80 s crosses the 1m, 10s and 1s rungs, hopping through the control queue.
        # A few more than WAITING are sent, so that WAITING are still waiting once deliveries flow.
        publish_s = run.publish(SENT_QUORUM, 12.0, 80.0, seed=42)
        wait_until(lambda: run.collector.unique >= 10, 60, "deliveries to flow before the kill")
        before = run.collector.unique
        # Quorum queues report their depth every few seconds: wait (bounded) for the count to settle.
        wait_until(lambda: ladder_depth(cluster, cluster_vhost) + run.collector.unique >= SENT_QUORUM - 20, 20,
                   "the quorum queues' depth to be reported")
        waiting = ladder_depth(cluster, cluster_vhost)
        killed_at = time.monotonic()
        cluster.node_named(leader).kill9()
        try:
            wait_until(lambda: cluster.home_of(cluster_vhost, "acemq.schedule.10s") not in (None, leader), 60,
                       "a new leader for the rungs")
            elected_s = time.monotonic() - killed_at
            result = run.wait_all(SENT_QUORUM, 400)
        finally:  # put the killed node back, so the cluster is whole for whatever runs next
            cluster.node_named(leader).start()
            cluster.node_named(leader).await_startup()
        after = [t for t in run.collector.times if t >= killed_at]
        first_after = (after[0] - killed_at) if after else -1.0
        gap = run.collector.longest_gap_after(killed_at)
        alive = run.relays_alive()
    matrix_row.update(profile="quorum", failure="rung leader kill -9", lost=result["lost"],
                      duplicated=result["duplicated"], resume_s=gap, sent=SENT_QUORUM, waiting_at_kill=waiting,
                      delivered_before_kill=before, publish_s=round(publish_s, 1), elected_s=round(elected_s, 1),
                      first_delivery_after_kill_s=round(first_after, 1), relays_alive=alive,
                      dead_letter_stalls_unstuck=run.unstuck)
    assert waiting >= WAITING, f"{WAITING} messages were waiting in the rungs at the kill"
    assert result["lost"] == 0 and result["delivered"] == SENT_QUORUM
    assert alive == [True, True]
    assert result["duplicated"] <= 4 * PREFETCH, "duplicates are bounded by the relays' windows"
