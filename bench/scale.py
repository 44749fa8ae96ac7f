"""Scale: many messages waiting in rungs (broker memory), then the relay's drain rate when a batch falls due at once."""

from __future__ import annotations

import json
import time
from typing import Any

from kombu import Queue

from kombu_ladder.contract import CONTROL, EXCHANGE
from kombu_ladder.producer import LadderProducer
from kombu_ladder.topology import declare

from .common import Config, Progress, Vhost, log, payload, queue_counts, queue_depth, rabbitmqctl
from .publish import timed
from .throughput import relay_round

__all__ = ["broker_memory", "vhost_queues", "run"]

#: Where the due batch is delivered.
TARGET = "bench.target"


def broker_memory() -> int:
    """RabbitMQ's total memory in bytes, as ``rabbitmqctl status`` reports it (the whole, shared broker)."""
    status = json.loads(rabbitmqctl("status", "--formatter", "json"))
    total = status["memory"]["total"]
    return int(total.get(status["memory"].get("strategy", "rss"), total["rss"]))


def vhost_queues(vhost: str) -> dict[str, dict[str, int]]:
    """Per-queue ``messages``, ``memory`` and ``message_bytes_ram`` of ``vhost``."""
    columns = ("messages", "memory", "message_bytes_ram")
    return {name: dict(zip(columns, values)) for name, values in queue_counts(vhost, columns).items()}


def _publish(producer: LadderProducer, n: int, countdown: float, label: str) -> float:
    body = payload(0, 0)
    _, wall_rate = timed(n, lambda i: producer.publish(body, routing_key=TARGET, exchange="", serializer=None,
                                                       content_type="application/json", delivery_mode=2,
                                                       countdown=countdown), label)
    return wall_rate  # messages per second of the clock, as the scale table has always shown


def _memory_snapshot(vhost: str) -> dict[str, Any]:
    queues = vhost_queues(vhost)
    return {
        "broker_total": broker_memory(),
        "vhost_messages": sum(q["messages"] for q in queues.values()),
        "vhost_queue_memory": sum(q["memory"] for q in queues.values()),
        "vhost_message_bytes_ram": sum(q["message_bytes_ram"] for q in queues.values()),
    }


def run(config: Config) -> dict[str, Any]:
    """Leave ``scale_waiting`` messages in the 1h rung and ``scale_due`` due at once; drain those with our relay."""
    waiting, due = config.scale_waiting, config.scale_due
    with Vhost("scale") as vhost, vhost.connection() as conn:
        declare(conn)
        channel = conn.channel()
        Queue(TARGET, durable=True)(channel).declare()
        before = _memory_snapshot(vhost.name)
        producer = LadderProducer(channel)
        log(f"scale: {waiting} messages with countdown=3600 and {due} with countdown=1.5, no relay running")
        rate_waiting = _publish(producer, waiting, 3600, "scale publish countdown=3600")
        rate_due = _publish(producer, due, 1.5, "scale publish countdown=1.5")
        progress = Progress(due, f"expired into {CONTROL}")
        deadline = time.monotonic() + 120 + due / 1000
        while time.monotonic() < deadline:
            depth, _ = queue_depth(conn, CONTROL)
            progress.update(depth)
            if depth >= due:
                break
            time.sleep(0.5)
        progress.close()
        time.sleep(2)  # let the broker's memory settle
        loaded = _memory_snapshot(vhost.name)
        log(f"scale: broker memory {before['broker_total'] / 2**20:.0f} MB -> {loaded['broker_total'] / 2**20:.0f} MB "
            f"with {loaded['vhost_messages']} messages waiting in this vhost")
        log(f"scale: relay draining {due} messages due at once")
        drain = relay_round(vhost, "ours", 1, expected=due, timeout=900)
        log(f"  drained {drain['count']} in {drain['seconds']:.1f}s = {drain['rate']:.0f}/s")
        delivered, _ = queue_depth(conn, TARGET)
        channel.close()
    return {
        "waiting": waiting, "due": due, "publish_rate_waiting": rate_waiting, "publish_rate_due": rate_due,
        "memory_before": before, "memory_loaded": loaded, "drain": drain, "delivered": delivered,
        "exchange": EXCHANGE,
    }
