"""Waiting: a million messages waiting on one node (memory, disk, publish rate), then all due at once and drained.

On each RabbitMQ major at hand (the shared broker, and the other one ``.ci/rabbitmq-alt``
runs when it answers), in a vhost of its own deleted at once afterwards:

1. the ladder declared, with the queue profile ``docs/operations.rst`` documents for
   that release: the ``ladder-lazy`` policy on 3.11 and older, none from 3.12 on
   (classic queues v2 keep messages on disk whatever the mode);
2. ``waiting_n`` 200-byte messages published with ``LadderProducer.publish``, all due
   at the same moment and waiting in the 1 h rung (the producer's clock is set an hour
   back, so that moment comes while they still wait): publish rate, in wall-clock and
   CPU time;
3. broker memory (the whole node's, and this vhost's queues') and the disk this vhost's
   message store takes, before and with every message waiting;
4. then they all fall due at once: a policy (``max-length: 0``) makes the rung
   dead-letter its whole contents into the control queue, as its TTL does, and
   ``RELAYS`` standalone relays deliver them to a consumer, which stamps each arrival.
   The drain time is from the first arrival to the last.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from typing import Any, Optional

from kombu import Queue

from kombu_ladder.contract import rung_name
from kombu_ladder.producer import LadderProducer
from kombu_ladder.topology import declare

from .bursts import TARGET, Fleet, Stamps, _summary, body
from .common import (
    PORT,
    PUBLISHER_OPTIONS,
    ROOT,
    Broker,
    Config,
    Progress,
    Vhost,
    log,
    queue_counts,
    queue_depth,
    wait_until,
)

__all__ = ["RELAYS", "LAZY_POLICY", "brokers", "run_on", "run"]

#: Standalone relays that drain the million once it falls due.
RELAYS = 4

#: The policy docs/operations.rst documents for RabbitMQ 3.11 and older: (name, pattern, definition, priority).
LAZY_POLICY = ("ladder-lazy", r"^acemq\.schedule\.", {"queue-mode": "lazy"}, 10)

#: The 1 h rung, where every message waits.
RUNG = rung_name(3600)


def _version(broker: Broker) -> str:
    return broker.rabbitmqctl("version").strip()


def _major_minor(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def brokers() -> list[Broker]:
    """The shared broker, and the node of the other RabbitMQ major ``.ci/rabbitmq-alt`` runs, if it answers."""
    main = Broker(_version(Broker("shared")))
    found = [main]
    script = os.path.join(ROOT, ".ci", "rabbitmq-alt")
    if not os.access(script, os.X_OK):
        return found
    try:
        env = subprocess.run([script, "env"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return found
    path = re.search(r"PATH=([^:\"']+)", env)
    port = re.search(r"LADDER_TEST_PORT=(\d+)", env)
    if not path or not port or int(port.group(1)) == PORT:
        return found
    other = Broker("other", port=int(port.group(1)), ctl=os.path.join(path.group(1), "rabbitmqctl"))
    try:
        found.append(Broker(_version(other), port=other.port, ctl=other.ctl))
    except (OSError, subprocess.SubprocessError):
        log(f"waiting: the other RabbitMQ node ({other.ctl}, port {other.port}) does not answer; skipped")
    return found


def _status(broker: Broker) -> dict[str, Any]:
    return json.loads(broker.rabbitmqctl("status", "--formatter", "json"))  # type: ignore[no-any-return]


def _node_memory(broker: Broker) -> int:
    memory = _status(broker)["memory"]
    total = memory["total"]
    return int(total.get(memory.get("strategy", "rss"), total["rss"]))


def _store_dir(broker: Broker, vhost: str) -> Optional[str]:
    """This vhost's message store directory on this machine (a node in a chroot: under its root)."""
    try:
        out = broker.rabbitmqctl("eval", f'rabbit_vhost:msg_store_dir_path(<<"{vhost}">>).')
    except subprocess.SubprocessError:
        return None
    path = out.strip().strip('"')
    if os.path.isdir(path):
        return path
    root = os.path.join(os.path.dirname(os.path.dirname(broker.ctl)), "root")
    rooted = root + path
    return rooted if os.path.isdir(rooted) else None


def _disk_bytes(path: Optional[str]) -> Optional[int]:
    if path is None:
        return None
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def _snapshot(broker: Broker, vhost: str) -> dict[str, Any]:
    columns = ("messages", "memory", "message_bytes_ram")
    queues = {name: dict(zip(columns, values)) for name, values in queue_counts(vhost, columns, ctl=broker.ctl).items()}
    return {
        "node_memory": _node_memory(broker),
        "vhost_messages": sum(q["messages"] for q in queues.values()),
        "vhost_queue_memory": sum(q["memory"] for q in queues.values()),
        "vhost_message_bytes_ram": sum(q["message_bytes_ram"] for q in queues.values()),
        "vhost_disk": _disk_bytes(_store_dir(broker, vhost)),
    }


def _set_policy(broker: Broker, vhost: str, name: str, pattern: str, definition: dict[str, Any],
                priority: int) -> None:
    broker.rabbitmqctl("set_policy", "-p", vhost, "--apply-to", "queues", "--priority", str(priority), name, pattern,
                       json.dumps(definition))


def run_on(broker: Broker, n: int) -> dict[str, Any]:
    """Publish ``n`` to wait on ``broker``, measure, let them fall due at once, drain; delete the vhost."""
    lazy = _major_minor(broker.name) < (3, 12)
    result: dict[str, Any] = {"broker": broker.name, "n": n, "relays": RELAYS,
                              "profile": "classic queues, ladder-lazy policy" if lazy else "classic queues (v2)"}
    with Vhost("waiting", broker) as vhost:
        with vhost.connection() as conn:
            declare(conn)
            Queue(TARGET, durable=True)(conn.default_channel).declare()
        if lazy:
            name, pattern, definition, priority = LAZY_POLICY
            _set_policy(broker, vhost.name, name, pattern, definition, priority)
        time.sleep(2)  # let the node's memory settle after the declarations
        result["before"] = _snapshot(broker, vhost.name)
        due = int(time.time() * 1000) + 5_000
        with vhost.connection(transport_options=PUBLISHER_OPTIONS) as conn:
            # an hour back: each message is due in exactly an hour by this clock, so it waits in the 1 h rung
            producer = LadderProducer(conn.channel(), clock=lambda: due / 1000 - 3600)
            progress = Progress(n, f"{broker.name}: publish")
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(n):
                producer.publish(body(i, due), routing_key=TARGET, exchange="", delivery_mode=2,
                                 content_type="application/octet-stream", countdown=3600)
                if i % 5000 == 0:
                    progress.update(i)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            progress.update(n)
            progress.close(f"{n / wall:,.0f}/s")
            result.update(publish_per_s=n / wall, publish_cpu_us=1e6 * cpu / n)
            if not wait_until(lambda: queue_depth(conn, RUNG)[0] >= n, 120 + n / 2000, interval=0.5):
                raise RuntimeError(f"{queue_depth(conn, RUNG)[0]:,} of {n:,} reached {RUNG}")
        time.sleep(5)  # let the node's memory settle with them waiting
        result["loaded"] = _snapshot(broker, vhost.name)
        mb = 2**20
        log(f"  {broker.name}: node memory {result['before']['node_memory'] / mb:,.0f} MB -> "
            f"{result['loaded']['node_memory'] / mb:,.0f} MB, this vhost's store "
            f"{(result['loaded']['vhost_disk'] or 0) / mb:,.0f} MB on disk, with {n:,} waiting")

        stamps = Stamps(vhost.url, n, time.time() + 300 + n / 500)
        fleet: Optional[Fleet] = None
        try:
            fleet = Fleet(vhost, "standalone", RELAYS)
            log(f"  {broker.name}: all {n:,} fall due at once; {RELAYS} relays deliver them")
            release: dict[str, Any] = {"max-length": 0, **({"queue-mode": "lazy"} if lazy else {})}
            _set_policy(broker, vhost.name, "bench-release", f"^{re.escape(RUNG)}$", release, 20)
            late, span = stamps.collect()
        finally:
            stamps.stop()
            if fleet is not None:
                fleet.stop()
    summary = _summary(late, n)
    result.update(arrived=summary["arrived"], drain_s=span, early=summary["early"],
                  drain_per_s=summary["arrived"] / span if span else None)
    if span:
        log(f"  {broker.name}: {summary['arrived']:,} delivered in {span:.1f} s, first to last "
            f"({result['drain_per_s']:,.0f}/s)")
    return result


def run(config: Config) -> dict[str, Any]:
    """Run :func:`run_on` on every broker at hand, one after the other."""
    out: dict[str, Any] = {"n": config.waiting_n, "relays": RELAYS, "brokers": []}
    for broker in brokers():
        log(f"waiting: {config.waiting_n:,} messages on RabbitMQ {broker.name} (port {broker.port})")
        try:
            out["brokers"].append(run_on(broker, config.waiting_n))
        except Exception as exc:  # noqa: BLE001 - reported in the page; the other broker still runs
            log(f"  FAILED on {broker.name}: {exc!r}")
            out["brokers"].append({"broker": broker.name, "error": f"{type(exc).__name__}: {exc}"})
    return out
