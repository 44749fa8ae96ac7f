"""Issue 35: readers accept a record kind only from its own exchange, on RabbitMQ and the simulator.

Whoever may write ``amq.default`` (relays, indexers, Celery's producers) or the marker exchange (every
reader) reaches a stream by name; a record that came that way is skipped, whatever it says.
"""

from __future__ import annotations

from typing import Any

from backends import Arrivals, declare_target
from kombu import Producer

from celery_ladder.adoption.records import encode as encode_adoption
from celery_ladder.adoption.transfer import Records
from kombu_ladder import Scheduler, cancel
from kombu_ladder.cancellation.records import encode
from kombu_ladder.controlplane import ADOPTED, ADOPTIONS, CANCELLATIONS, MARKER

#: Every route into a stream but its kind's own exchange.
FORGED_ROUTES = ["", MARKER.exchange]


def test_a_cancellation_written_through_another_exchange_cancels_nothing(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.forged")
        victim = sched.in_(3.0, b"victim", routing_key="t.forged")
        sibling = sched.in_(3.0, b"sibling", routing_key="t.forged")
        now_ms = int(ladder_backend.clock() * 1000)
        raw = Producer(conn.default_channel)
        for exchange in FORGED_ROUTES:
            raw.publish(encode(victim, at=now_ms), exchange=exchange, routing_key=CANCELLATIONS,
                        content_type="application/json", content_encoding="utf-8")
        cancel(conn, sibling, clock=ladder_backend.clock)  # the right route: through the cancel exchange
        (_, _, message), = Arrivals(ladder_backend, conn, "t.forged").wait(1, 20)
        assert message.properties["message_id"] == victim
        ladder_backend.wait_until(lambda: sched.delivered and sched.cancelled, 20, "the delivery and the drop counted")
        assert (sched.cancelled, sched.delivered) == (1, 1)


def test_an_adoption_record_written_through_another_exchange_is_not_trusted(ladder_backend: Any) -> None:
    eta = "2099-01-01T00:00:00+00:00"
    due = int(ladder_backend.clock() * 1000) + 3_600_000
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock):
        raw = Producer(conn.default_channel)
        for exchange in FORGED_ROUTES:
            raw.publish(encode_adoption("forged", eta, due=due), exchange=exchange, routing_key=ADOPTIONS,
                        content_type="application/json", content_encoding="utf-8")
        raw.publish(encode_adoption("genuine", eta, due=due), exchange=ADOPTED.exchange, routing_key=ADOPTIONS,
                    content_type="application/json", content_encoding="utf-8")
        records = Records(conn, clock=ladder_backend.clock)
        try:
            assert records.catch_up(timeout=20)
            assert ("genuine", eta) in records.adopted and ("forged", eta) not in records.adopted
            assert records.skipped == len(FORGED_ROUTES)
        finally:
            records.close()
