"""Relay throughput on the cluster: classic against quorum, and one, two, three relays on different nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faults.faultkit import wait_until
from kombu import Connection, Queue

from kombu_ladder import Scheduler, declare

from .clusterkit import Cluster, RelayProcess
from .conftest import THROUGHPUT
from .scenario import TimedCollector

pytestmark = [pytest.mark.broker, pytest.mark.timeout(600)]

#: Expired messages waiting in the control queue when the relays start.
BACKLOG = 6000
TARGET = "cluster.throughput"


def _drain_rate(cluster: Cluster, vhost: str, tmp_path: Path, queue_type: str, relays: int) -> dict[str, Any]:
    """Fill the control queue with BACKLOG expired messages, start ``relays`` relays (relay i on node i),
    and time the deliveries from the first to the last."""
    with Connection(cluster.nodes[0].url(vhost)) as conn:
        declare(conn, queue_type=queue_type)
    with Connection(cluster.nodes[1].url(vhost)) as conn:
        Queue(TARGET, durable=True)(conn.default_channel).declare()
        with Scheduler.on(conn, relay=False, serializer="json", queue_type=queue_type) as scheduler:
            for n in range(BACKLOG):
                scheduler.in_(1.0, {"n": n}, routing_key=TARGET)
    control = "acemq.schedule.due"

    def expired() -> bool:
        out = cluster.any_ctl("list_queues", "-p", vhost, "name", "messages", "--no-table-headers")
        return any(line.split() == [control, str(BACKLOG)] for line in out.splitlines())

    wait_until(expired, 60, f"{BACKLOG} messages expired into the control queue")
    procs = [RelayProcess(cluster.failover_url(vhost, i), tmp_path, f"{queue_type}-{relays}-{i}",
                          "--queue-type", queue_type) for i in range(relays)]
    with TimedCollector(cluster.nodes[1].url(vhost), TARGET) as collector:
        for proc in procs:
            proc.start()
        try:
            wait_until(lambda: collector.unique >= BACKLOG, 180, "the backlog relayed",
                       lambda: "\n".join(p.log()[-1500:] for p in procs))
        finally:
            for proc in procs:
                proc.stop()
        seconds = collector.times[-1] - collector.times[0]
    return {"queue_type": queue_type, "relays": relays, "messages": BACKLOG, "seconds": round(seconds, 2),
            "per_second": round(BACKLOG / seconds)}


@pytest.mark.parametrize("queue_type,relays", [(q, n) for q in ("classic", "quorum") for n in (1, 2, 3)])
def test_relay_throughput(cluster: Cluster, cluster_vhost: str, tmp_path: Path, queue_type: str,
                          relays: int) -> None:
    figures = _drain_rate(cluster, cluster_vhost, tmp_path, queue_type, relays)
    THROUGHPUT.append(figures)
    print(f"\nTHROUGHPUT {figures}")
    assert figures["per_second"] > 50, figures
