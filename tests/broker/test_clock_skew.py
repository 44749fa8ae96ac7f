"""Clock skew on a real broker: a producer clock behind delivers early, one ahead delivers late; none is stuck."""

from __future__ import annotations

import json
import time

import pytest
from helpers import wait_for
from kombu import Connection, Queue

from kombu_ladder import LadderProducer, Scheduler

pytestmark = pytest.mark.broker

TARGET = "skew.target"


def test_producer_clock_skew_moves_delivery_by_the_skew(connection: Connection) -> None:
    arrivals: dict[str, float] = {}
    Queue(TARGET, durable=False)(connection.default_channel).declare()
    connection.default_channel.queue_purge(TARGET)
    with Scheduler.on(connection):  # the relay, on the true clock
        started = time.time()
        behind = LadderProducer(connection.default_channel, serializer="json", clock=lambda: time.time() - 3600)
        ahead = LadderProducer(connection.default_channel, serializer="json", clock=lambda: time.time() + 5)
        # An hour behind with a 30 s countdown: its due-at is long past by the relay's clock,
        # so it leaves when its first rung (10 s, chosen from the countdown) expires: 20 s early.
        behind.publish({"who": "behind"}, routing_key=TARGET, countdown=30)
        # Five seconds ahead with a 2 s countdown: due 7 s from now by the relay's clock.
        ahead.publish({"who": "ahead"}, routing_key=TARGET, countdown=2)

        def collect() -> bool:
            message = connection.default_channel.basic_get(TARGET, no_ack=True)
            if message is not None:
                arrivals[json.loads(message.body)["who"]] = time.time() - started
            return len(arrivals) == 2

        wait_for(collect, 40, interval=0.05, message="both skewed messages")
    assert 9.0 <= arrivals["behind"] < 25.0, arrivals  # early by the skew, but not before its first rung
    assert arrivals["ahead"] >= 5.9, arrivals  # late by the skew (7 s, the ladder delivers up to 1 s early)
