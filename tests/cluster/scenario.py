"""One cluster scenario: declare, start relays on two nodes, publish from two nodes, break a node, count."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import helpers
from faults.faultkit import Collector, Confirms, wait_until
from kombu import Connection, Queue

from kombu_ladder import LadderProducer, Scheduler, declare
from kombu_ladder.contract import rung_names

from .clusterkit import Cluster, RelayProcess

__all__ = ["TimedCollector", "Scenario", "ladder_depth"]

TARGET = "cluster.target"

#: Seconds without a delivery, messages missing, before a quorum scenario looks for a stalled rung.
STALL = 20.0

_DISCARDED = re.compile(r"num_discarded => (\d+)")


class TimedCollector(Collector):
    """A :class:`Collector` that also keeps when each delivery arrived."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(url, queue)
        self.times: list[float] = []

    def _on_message(self, body: Any, message: Any) -> None:
        self.times.append(time.monotonic())
        super()._on_message(body, message)

    def longest_gap_after(self, since: float) -> float:
        """The longest pause between deliveries from ``since`` on (the first one counts from ``since``)."""
        stamps = [since, *[t for t in self.times if t >= since]]
        return max((b - a for a, b in zip(stamps, stamps[1:])), default=0.0)


def ladder_depth(cluster: Cluster, vhost: str) -> int:
    """Messages (ready and unacked) in the rungs and the control queue, as the cluster reports them."""
    return helpers.ladder_depth(cluster.any_ctl, vhost)


def _ra_name(vhost: str, queue: str) -> str:
    return f"'{vhost}_{queue}'"  # a quorum queue's Ra server name (plain vhost names only)


def stalled_rungs(cluster: Cluster, vhost: str) -> dict[str, int]:
    """Quorum rungs that hold dead-lettered messages not yet forwarded, as their leaders report."""
    held = {}
    for queue in rung_names():
        leader = cluster.home_of(vhost, queue)
        if not leader:
            continue
        node = cluster.node_named(leader)
        if not node.reachable():
            continue
        out = node.ctl("eval", f"ra:local_query({{{_ra_name(vhost, queue)}, node()}}, "
                               f"fun rabbit_fifo:overview/1).", check=False)
        found = _DISCARDED.search(" ".join(out.split()))
        if found and int(found.group(1)) > 0:
            held[queue] = int(found.group(1))
    return held


def transfer_leadership(cluster: Cluster, vhost: str, queue: str) -> None:
    """Move a quorum queue's leadership to another live node (a new leader starts a new dead-letter worker)."""
    leader = cluster.home_of(vhost, queue)
    target = next(n for n in cluster.nodes if n.name != leader and n.reachable())
    name = _ra_name(vhost, queue)
    cluster.node_named(str(leader)).ctl(
        "eval", f"ra:transfer_leadership({{{name}, '{leader}'}}, {{{name}, '{target.name}'}}).", check=False)


class Scenario:
    """Ladder declared through node 1 (so its rungs live there, or are led from there), target queue on
    node 2, relays with failover URLs starting on nodes 2 and 3, producers on nodes 2 and 3."""

    def __init__(self, cluster: Cluster, vhost: str, logdir: Path, queue_type: str) -> None:
        self.cluster = cluster
        self.vhost = vhost
        self.queue_type = queue_type
        with Connection(cluster.nodes[0].url(vhost)) as conn:
            declare(conn, queue_type=queue_type)
        with Connection(cluster.nodes[1].url(vhost)) as conn:
            Queue(TARGET, durable=True)(conn.default_channel).declare()
        self.relays = [RelayProcess(cluster.failover_url(vhost, i), logdir, f"n{i + 1}", "--queue-type", queue_type)
                       for i in (1, 2)]
        self.collector = TimedCollector(cluster.nodes[1].url(vhost), TARGET)
        #: Rungs whose stalled dead-letter worker :meth:`wait_all` restarted by moving their leader.
        self.unstuck: list[str] = []
        #: When :meth:`publish` counted its due times from (``time.monotonic()``).
        self.anchor = 0.0
        #: How many messages :meth:`publish` sent (numbered from 0).
        self.sent = 0

    def __enter__(self) -> "Scenario":
        for relay in self.relays:
            relay.start()
        self.collector.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.collector.__exit__()
        for relay in self.relays:
            relay.stop()

    def publish(self, count: int, delays: Callable[[int], float], *, budget: Optional[float] = None) -> float:
        """Schedule ``count`` numbered messages, half through node 2, half through node 3; return seconds taken.

        Without ``budget``, message ``n`` is due ``delays(n)`` seconds after its own publish. With
        ``budget``, the due times are absolute: ``delays(n)`` seconds after :attr:`anchor`, the
        moment ``budget`` seconds after publishing started. A publish slowed by a loaded machine then
        cannot make the first messages due before the last one is sent; publishing that takes longer
        than ``budget`` fails the scenario's setup, saying so.

        Every publish is confirmed by the broker before this returns, as the ladder's promise starts at a
        confirmed publish: a message missing later went missing inside the ladder, not on its way in. The
        confirms are pipelined and waited for at the end of each channel (with a confirm waited for each,
        5,000 took 48 s and 5,600 to quorum rungs 123 s on a loaded machine). Unconfirmed, as they were
        before, 9 of 5,200 went missing in one run on RabbitMQ 3.10 with every queue empty and the relays
        having passed on every message they had received; which side lost them could not be told.
        """
        started = time.monotonic()
        self.anchor = started + (budget or 0.0)
        anchor_wall = datetime.now(timezone.utc) + timedelta(seconds=budget or 0.0)
        half = count // 2
        for node, numbers in ((self.cluster.nodes[1], range(half)), (self.cluster.nodes[2], range(half, count))):
            with Connection(node.url(self.vhost)) as conn:
                channel = conn.channel()
                confirms = Confirms(channel)
                producer = LadderProducer(channel, serializer="json", queue_type=self.queue_type)
                for n in numbers:
                    when: dict[str, Any] = ({"countdown": delays(n)} if budget is None
                                            else {"eta": anchor_wall + timedelta(seconds=delays(n))})
                    producer.publish({"n": n}, routing_key=TARGET, message_id=str(n), **when)
                confirms.wait(conn, len(numbers), started + (budget or 120.0) - time.monotonic(), node.name)
        self.sent = count
        taken = time.monotonic() - started
        assert budget is None or taken < budget, (
            f"publishing {count} messages took {taken:.1f} s, over the {budget:.0f} s budget before the first is due")
        return taken

    def wait_all(self, sent: int, timeout: float) -> dict[str, int]:
        """Wait until every message arrived and the ladder is empty; return the collector's figures.

        On the quorum profile, deliveries that stop for :data:`STALL` seconds while the ladder is
        not done (messages missing, or all of them delivered and the rungs still holding some: the
        copies an at-least-once dead-lettering sends twice) are checked for RabbitMQ 3.10's stalled
        at-least-once dead-letter worker (rabbitmq-server PR #7677): a rung holding dead-lettered
        messages it no longer forwards gets its leadership moved to another node, the operator's
        remedy, and the rung is recorded in :attr:`unstuck`.
        """
        quiet_since = [time.monotonic()]

        def unstick_if_quiet(now: float) -> None:
            if self.queue_type != "quorum" or now - max(self.collector.last_at, quiet_since[0]) <= STALL:
                return
            quiet_since[0] = now
            for queue, backlog in stalled_rungs(self.cluster, self.vhost).items():
                self.unstuck.append(f"{queue} ({backlog} dead-lettered, held)")
                transfer_leadership(self.cluster, self.vhost, queue)

        def settled() -> bool:
            now = time.monotonic()
            if self.collector.unique < sent:
                unstick_if_quiet(now)
                return False
            if now - self.collector.last_at <= 2.0:
                return False
            if ladder_depth(self.cluster, self.vhost) == 0:
                return True
            unstick_if_quiet(now)
            return False

        wait_until(settled, timeout, f"all {sent} messages delivered", self.diagnose)
        return self.collector.figures(sent)

    def diagnose(self) -> str:
        logs = "\n".join(relay.log()[-2000:] for relay in self.relays)
        queues = self.cluster.any_ctl("list_queues", "-p", self.vhost, "name", "type", "leader", "messages_ready",
                                      "messages_unacknowledged", "consumers", "--no-table-headers")
        held = stalled_rungs(self.cluster, self.vhost) if self.queue_type == "quorum" else {}
        missing = [n for n in range(self.sent) if n not in self.collector.seen]
        return (f"delivered {self.collector.unique} distinct, {self.collector.total} in all; "
                f"missing {len(missing)}: {missing[:40]} (published through node 2 below {self.sent // 2}, "
                f"node 3 from there)\n"
                f"queues:\n{queues}\ndead-lettered and held by rungs now: {held}; unstuck before: {self.unstuck}\n"
                f"relays alive: {self.relays_alive()}\n{logs}")

    def relays_alive(self) -> list[bool]:
        return [relay.alive() for relay in self.relays]


def try_schedule(url: str, queue_type: str, timeout: float = 15.0) -> Optional[str]:
    """Schedule one message through ``url``; return None if it worked, else what the producer saw."""
    try:
        with Connection(url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
            with Scheduler.on(conn, relay=False, serializer="json", queue_type=queue_type) as scheduler:
                scheduler.in_(60, {"n": -1}, routing_key="cluster.probe")
        return None
    except Exception as exc:  # noqa: BLE001 - what a user's producer would see, reported as text
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def timed(action: Callable[[], None]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started
