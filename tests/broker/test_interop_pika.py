"""Interop: pika plays "another AceMQ library" on the same broker, with every name written out literally."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pika
import pytest
from helpers import list_queues, vhost_url
from kombu import Connection

from kombu_ladder import Scheduler, declare

pytestmark = pytest.mark.broker

RUNGS = [(3600, "acemq.schedule.1h"), (600, "acemq.schedule.10m"), (60, "acemq.schedule.1m"),
         (10, "acemq.schedule.10s"), (1, "acemq.schedule.1s")]


def pika_connection(vhost: str) -> pika.BlockingConnection:
    from helpers import BROKER_HOST, BROKER_PORT

    return pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@{BROKER_HOST}:{BROKER_PORT}/{quote(vhost, safe='')}"))


def pika_declare(channel: Any) -> None:
    """The topology as another AceMQ library declares it, from the contract text."""
    channel.exchange_declare(exchange="acemq.schedule", exchange_type="direct", durable=True)
    for seconds, name in RUNGS:
        channel.queue_declare(queue=name, durable=True, arguments={
            "x-message-ttl": seconds * 1000,
            "x-dead-letter-exchange": "acemq.schedule",
            "x-dead-letter-routing-key": "acemq.schedule.due",
        })
        channel.queue_bind(queue=name, exchange="acemq.schedule", routing_key=name)
    channel.queue_declare(queue="acemq.schedule.due", durable=True)
    channel.queue_bind(queue="acemq.schedule.due", exchange="acemq.schedule", routing_key="acemq.schedule.due")


def test_pika_declares_first_then_ours_succeeds(fresh_vhost: str) -> None:
    with pika_connection(fresh_vhost) as pconn:
        pika_declare(pconn.channel())
    with Connection(vhost_url(fresh_vhost)) as conn:
        assert declare(conn) == [name for _, name in RUNGS] + ["acemq.schedule.due"]
    with pika_connection(fresh_vhost) as pconn:
        pika_declare(pconn.channel())  # and the other library can still declare after us
    assert list_queues(fresh_vhost)["acemq.schedule.10s"]["arguments"] == {
        "x-message-ttl": 10000, "x-dead-letter-exchange": "acemq.schedule",
        "x-dead-letter-routing-key": "acemq.schedule.due",
    }


@pytest.mark.parametrize("due_as", [int, str], ids=["due-at-int", "due-at-string"])
def test_our_relay_delivers_a_message_scheduled_by_pika(connection: Connection, rabbit_vhost: str,
                                                         due_as: type) -> None:
    with Scheduler.on(connection) as sched, pika_connection(rabbit_vhost) as pconn:
        channel = pconn.channel()
        channel.queue_declare(queue="t.pika.in", durable=True)
        channel.queue_purge(queue="t.pika.in")
        due = int(time.time() * 1000) + 1500
        body = json.dumps({"from": "pika"}).encode()
        channel.basic_publish(
            exchange="acemq.schedule", routing_key="acemq.schedule.1s", body=body,
            properties=pika.BasicProperties(
                content_type="application/octet-stream", type="ScheduledMessage", delivery_mode=2,
                correlation_id="pika-corr", headers={
                    "x-schedule-exchange": "",
                    "x-schedule-routing-key": "t.pika.in",
                    "x-schedule-due-at": due_as(due),
                    "x-schedule-content-type": "application/json",
                    "app": "pika-header",
                }),
        )
        deadline = time.monotonic() + 20
        while True:
            method, props, got = channel.basic_get(queue="t.pika.in", auto_ack=True)
            if method is not None:
                break
            assert time.monotonic() < deadline, "the relay did not deliver pika's message"
            pconn.sleep(0.05)
        arrived = time.time() * 1000
        assert got == body
        assert props.content_type == "application/json"
        assert props.correlation_id == "pika-corr"
        assert props.delivery_mode == 2
        assert props.headers == {"app": "pika-header"}
        assert props.type != "ScheduledMessage"
        assert due - 1100 <= arrived <= due + 1000
        assert sched.malformed == 0


def pika_relay_once(channel: Any, method: Any, props: Any, body: bytes) -> None:
    """The Ruby doc's algorithm, written from its text: deliver when due, else the largest rung that fits."""
    headers = dict(props.headers or {})
    raw = headers["x-schedule-due-at"]
    due = int(raw.decode() if isinstance(raw, bytes) else raw)
    remaining = due - int(time.time() * 1000)
    fitting = [name for seconds, name in RUNGS if seconds * 1000 <= remaining]
    if fitting:
        kept = {k: v for k, v in headers.items() if k != "x-death" and not k.startswith(("x-first-death-",
                                                                                          "x-last-death-"))}
        channel.basic_publish(exchange="acemq.schedule", routing_key=fitting[0], body=body,
                              properties=pika.BasicProperties(
                                  content_type=props.content_type, content_encoding=props.content_encoding,
                                  type="ScheduledMessage", delivery_mode=2,
                                  correlation_id=props.correlation_id, headers=kept))
    else:
        app = {k: v for k, v in headers.items()
               if not k.startswith(("x-schedule-", "x-death", "x-first-death-", "x-last-death-"))}
        content_type = headers["x-schedule-content-type"]
        channel.basic_publish(exchange=headers["x-schedule-exchange"], routing_key=headers["x-schedule-routing-key"],
                              body=body, properties=pika.BasicProperties(
                                  content_type=content_type.decode() if isinstance(content_type, bytes)
                                  else content_type,
                                  content_encoding=props.content_encoding, correlation_id=props.correlation_id,
                                  delivery_mode=2, headers=app or None))
    channel.basic_ack(method.delivery_tag)


def test_a_minimal_pika_relay_delivers_what_we_scheduled(connection: Connection, rabbit_vhost: str) -> None:
    with Scheduler.on(connection, relay=False) as sched, pika_connection(rabbit_vhost) as pconn:
        channel = pconn.channel()
        channel.confirm_delivery()
        channel.basic_qos(prefetch_count=50)
        channel.queue_declare(queue="t.pika.out", durable=True)
        channel.queue_purge(queue="t.pika.out")
        due = time.time() + 2.5
        sched.in_(2.5, {"from": "kombu", "n": [1, 2]}, routing_key="t.pika.out",
                  headers={"app": "ours"}, correlation_id="ours-corr")
        deadline = time.monotonic() + 20
        relayed = 0
        got = None
        for method, props, body in channel.consume("acemq.schedule.due", inactivity_timeout=0.1):
            if method is not None:
                pika_relay_once(channel, method, props, body)
                relayed += 1
            method_, props_, body_ = channel.basic_get(queue="t.pika.out", auto_ack=True)
            if method_ is not None:
                got = (props_, body_)
                break
            assert time.monotonic() < deadline, "the pika relay did not deliver our message"
        channel.cancel()
        arrived = time.time()
    assert got is not None
    props, body = got
    assert json.loads(body) == {"from": "kombu", "n": [1, 2]}
    assert props.content_type == "application/json"
    assert props.content_encoding == "utf-8"
    assert props.correlation_id == "ours-corr"
    assert props.headers == {"app": "ours"}
    assert relayed == 2  # 2.5 s: 1 s rung, one hop into 1 s, then delivered
    assert due - 1.1 <= arrived <= due + 1.0
