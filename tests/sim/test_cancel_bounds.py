"""Cancellation state is bounded by what can still be waiting, and no live cancellation is forgotten (simulator)."""

from __future__ import annotations

from backends import Arrivals, SimulatorBackend, declare_target

from kombu_ladder import Scheduler
from kombu_ladder.cancellation.records import LIFE
from kombu_ladder.cancellation.stream import cancel_many

HOUR = 3600
DAY = 24 * HOUR


def test_a_relay_reads_only_the_records_that_can_still_drop_a_message() -> None:
    backend = SimulatorBackend()
    try:
        with backend.connection() as conn:
            with Scheduler.on(conn, relay=False, clock=backend.clock):
                pass  # declares the stream and its exchange
            cancel_many(conn, [f"old-{n}" for n in range(5000)])
            backend.broker.advance(LIFE / 1000 + 120)  # older than any message they could drop
            cancel_many(conn, [f"live-{n}" for n in range(10)])
            with Scheduler.on(conn, clock=backend.clock) as sched:
                assert sched._relay is not None
                watch = sched._relay.core.cancels
                assert watch.loaded is None  # no snapshot yet: it read the last day and hour back
                assert watch.cancellations.read == 1  # one batch record of the ten live ids (markers are not records)
                assert len(watch.live) == 10 and "live-9" in watch.live and "old-0" not in watch.live
    finally:
        backend.close()


def test_a_cancelled_message_a_month_ahead_is_dropped_after_a_day_without_relays() -> None:
    """Cancel a message due in 30 days, run no relay for 20 hours (it waits in acemq.schedule.due from its
    first hour on), write 20,000 other records meanwhile: a relay started then still drops it."""
    backend = SimulatorBackend()
    try:
        with backend.connection() as conn:
            declare_target(conn, "t.month")
            with Scheduler.on(conn, relay=False, clock=backend.clock) as publisher:
                doomed = publisher.in_(30 * DAY, b"doomed", routing_key="t.month")
                publisher.in_(30 * DAY, b"kept", routing_key="t.month", message_id="kept")
                backend.broker.advance(HOUR / 2)
                publisher.cancel(doomed)
            backend.broker.advance(10 * HOUR)
            cancel_many(conn, [f"other-{n}" for n in range(20_000)])
            backend.broker.advance(10 * HOUR)
            with Scheduler.on(conn, clock=backend.clock) as relaying:
                backend.wait_until(lambda: relaying.cancelled == 1, 60, "the month-ahead message dropped")
                backend.wait_until(lambda: relaying.delivered == 1, 30 * DAY, "its sibling delivered on its day")
            (_, _, message), = Arrivals(backend, conn, "t.month").wait(1, 1)
            assert message.properties["message_id"] == "kept"
    finally:
        backend.close()
