"""Routing through the ladder: custom routes, queues, topic and explicit exchanges, priority, expires."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import pytest
from celery.utils.time import maybe_iso8601
from helpers import queue_depth, wait_for
from kombu import Connection, Exchange, Producer, Queue

from kombu_ladder.relay import Relay

from .recording import relay_of

pytestmark = [pytest.mark.broker, pytest.mark.celery]

MAX_LATE = 1.5


@pytest.fixture
def celery_overrides() -> dict[str, Any]:
    return {
        "timezone": "Europe/Paris",
        "task_queues": [
            Queue("celery"),
            Queue("reports", Exchange("reports", type="direct"), routing_key="reports"),
            Queue("events.created", Exchange("events", type="topic"), routing_key="events.created.#"),
            Queue("urgent", Exchange("urgent", type="direct"), routing_key="urgent",
                  queue_arguments={"x-max-priority": 10}),
        ],
        "task_routes": {"t.report": {"queue": "reports"}},
    }


def _on_time(run: Any) -> bool:
    late = run.at - maybe_iso8601(run.eta).timestamp()
    return -0.02 <= late <= MAX_LATE


def test_routes_queues_exchanges_and_priority_are_kept(celery_app: Any, celery_worker: Any) -> None:
    stamp, report = celery_app.tasks["t.stamp"], celery_app.tasks["t.report"]
    relay = relay_of(celery_worker)
    delivered = relay.counters.delivered
    report.apply_async(("routed",), countdown=2)
    stamp.apply_async(("queue",), queue="reports", countdown=2.5)
    stamp.apply_async(("topic",), exchange="events", routing_key="events.created.eu", countdown=3)
    stamp.apply_async(("explicit",), exchange="reports", routing_key="reports", countdown=2)
    stamp.apply_async(("priority",), queue="urgent", priority=7, countdown=2)
    naive = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=2.5)
    stamp.apply_async(("naive",), eta=naive)  # read as the worker reads it, whatever the app's timezone
    labels = {"routed", "queue", "topic", "explicit", "priority", "naive"}
    wait_for(lambda: labels <= celery_app.recorder.labels(), timeout=30, message="every routed task")
    got = {label: celery_app.recorder.of(label)[0] for label in labels}
    assert (got["routed"].exchange, got["routed"].routing_key) == ("", "reports")
    assert (got["queue"].exchange, got["queue"].routing_key) == ("", "reports")
    assert (got["topic"].exchange, got["topic"].routing_key) == ("events", "events.created.eu")
    assert (got["explicit"].exchange, got["explicit"].routing_key) == ("reports", "reports")
    assert (got["priority"].routing_key, got["priority"].priority) == ("urgent", 7)
    assert all(_on_time(run) for run in got.values()), {k: (r.at, r.eta) for k, r in got.items()}
    wait_for(lambda: relay.counters.delivered - delivered >= len(labels), timeout=10,
             message="the relay to count each delivery (it counts one once the broker confirms it)")
    assert relay.counters.delivered - delivered == len(labels)
    assert relay.counters.parked == 0


def test_expires_is_governed_by_the_task_header(celery_app: Any, celery_worker: Any) -> None:
    stamp = celery_app.tasks["t.stamp"]
    expired = stamp.apply_async(("expired",), countdown=2, expires=1)
    kept = stamp.apply_async(("kept",), countdown=2, expires=60)
    wait_for(lambda: celery_app.recorder.of("kept"), timeout=20, message="the unexpired task")
    wait_for(lambda: expired.state == "REVOKED", timeout=10, message="the expired task to be revoked")
    assert kept.state == "SUCCESS"
    assert celery_app.recorder.of("expired") == []


@pytest.fixture
def standalone_relay(broker_url: str) -> Iterator[Relay]:
    with Connection(broker_url) as conn:
        relay = Relay(conn)
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        assert relay.ready.wait(10)
        yield relay
        relay.stop()
        thread.join(10)


def test_delivered_message_is_what_vanilla_celery_publishes(celery_app: Any, connection: Connection,
                                                            standalone_relay: Relay) -> None:
    stamp = celery_app.tasks["t.stamp"]
    queue = f"fresh-{uuid.uuid4().hex[:6]}"
    eta = datetime.now(timezone.utc) + timedelta(seconds=2)
    options = dict(eta=eta, task_id="same-id", queue=queue, priority=3, expires=eta + timedelta(minutes=5),
                   headers={"x-probe": "kept"}, compression="zlib")
    stamp.apply_async(("same",), **options)
    assert queue_depth(connection, queue) == 0, "the destination queue is declared when the task is scheduled"
    celery_app.conf.ladder_enabled = False
    stamp.apply_async(("same",), **options)
    wait_for(lambda: queue_depth(connection, queue) == 2, timeout=15, message="the relayed copy")
    channel = connection.channel()
    vanilla, laddered = channel.basic_get(queue, no_ack=True), channel.basic_get(queue, no_ack=True)
    channel.queue_delete(queue)
    assert laddered.body == vanilla.body
    assert laddered.headers == vanilla.headers
    assert vanilla.properties.pop("expiration"), "Celery 5.7 turns expires into an AMQP expiration"
    assert "expiration" not in laddered.properties, "a per-message expiration is never parked in a rung"
    assert laddered.properties == vanilla.properties
    assert time.time() >= eta.timestamp() - 1
    wait_for(lambda: standalone_relay.counters.delivered >= 1, timeout=10,
             message="the relay to count the delivery (it counts one once the broker confirms it)")


def test_a_producer_of_your_own_is_wrapped_for_eta_tasks(celery_app: Any, connection: Connection) -> None:
    stamp = celery_app.tasks["t.stamp"]
    with celery_app.connection_for_write() as conn:
        own = Producer(conn)
        stamp.apply_async(("own",), countdown=30, producer=own)
        stamp.apply_async(("own-now",), producer=own, queue="reports")
    assert queue_depth(connection, "acemq.schedule.10s") == 1
    assert queue_depth(connection, "reports") == 1, "a task without ETA goes straight to its queue"
