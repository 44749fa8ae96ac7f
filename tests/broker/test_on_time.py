"""The relay holds the last residual: a plain Kombu consumer gets each message at its due time, not early."""

from __future__ import annotations

import socket
from typing import Any

from backends import declare_target
from kombu import Consumer, Queue

from kombu_ladder import LadderProducer, Scheduler

#: How early (s) a delivery may reach a Kombu consumer now that the relay holds the residual.
EARLY = 0.005
#: How late (s): the broker's expiry lag, the relay's publish and confirm, the consumer's read. On the
#: simulator's virtual clock that is all; on RabbitMQ the relay's timer and this consumer share two cores with
#: CI's other lanes, which made a delivery 106 ms late on 4.0 (a delivery a rung off would be a second off).
LATE = {"simulator": 0.050, "rabbitmq": 0.250}

DELAYS = (1.5, 2.3, 3.7, 12.4)


def _drain(conn: Any) -> None:
    try:
        conn.drain_events(timeout=0.002)
    except (socket.timeout, TimeoutError):
        pass


def test_a_kombu_consumer_gets_each_message_at_its_due_time(ladder_backend: Any) -> None:
    clock = ladder_backend.clock
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=clock) as sched, \
            ladder_backend.connection() as listen:
        declare_target(conn, "t.ontime")
        seen: dict[bytes, float] = {}

        def received(body: Any, message: Any) -> None:
            seen[message.body] = clock()
            message.ack()

        consumer = Consumer(listen, [Queue("t.ontime", no_declare=True)], callbacks=[received], accept=None)
        consumer.consume()
        producer = LadderProducer(conn.default_channel, clock=clock)
        due = {}
        for delay in DELAYS:
            body = f"{delay}".encode()
            due[body] = clock() + delay
            producer.publish(body, routing_key="t.ontime", countdown=delay)

        def all_seen() -> bool:
            _drain(listen)
            return len(seen) == len(DELAYS)

        ladder_backend.wait_until(all_seen, timeout=30, message="every delivery", interval=0.001)
        lateness = {body: round(seen[body] - due[body], 4) for body in due}
        assert all(-EARLY <= late <= LATE[ladder_backend.name] for late in lateness.values()), lateness
        ladder_backend.wait_until(lambda: sched.delivered == len(DELAYS), 10, "the deliveries' confirms")
        # held, not hopped: 12.4 s takes the 10 s rung and is then held 2.4 s; the others the 1 s rung
        assert sched.hops == 0
