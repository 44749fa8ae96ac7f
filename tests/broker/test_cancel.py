"""Cancellation: Scheduler.cancel, kombu_ladder.cancel and the relays that enforce them, on both backends."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
from backends import Arrivals, declare_target, depth

import kombu_ladder
from kombu_ladder import LadderProducer, Scheduler
from kombu_ladder.cancellation.records import STREAM, encode


def _relay_of(sched: Scheduler) -> Any:
    assert sched._relay is not None
    return sched._relay.core


def test_in_and_at_return_the_message_id_generated_or_given(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.ids")
        generated = sched.in_(1.5, b"a", routing_key="t.ids")
        given = sched.in_(1.5, b"b", routing_key="t.ids", message_id="order-17")
        assert len(generated) == 36 and given == "order-17"
        arrivals = Arrivals(ladder_backend, conn, "t.ids").wait(2, 20)
        assert {m.properties["message_id"]: m.body for _, _, m in arrivals} == {generated: b"a", "order-17": b"b"}


def test_a_cancelled_message_is_dropped_at_delivery_and_its_sibling_delivered(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.cancel")
        doomed = sched.in_(1.2, b"doomed", routing_key="t.cancel")
        sched.in_(1.2, b"kept", routing_key="t.cancel")
        sched.cancel(doomed)
        ladder_backend.wait_until(lambda: sched.cancelled == 1 and sched.delivered == 1, 20, "one dropped, one sent")
        arrivals = Arrivals(ladder_backend, conn, "t.cancel")
        assert [m.body for _, _, m in arrivals.wait(1)] == [b"kept"]
        assert (sched.hops, sched.parked) == (0, 0)
        assert depth(conn, "acemq.schedule.due") == 0


def test_a_cancelled_message_is_dropped_at_its_first_hop(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.hop")
        doomed = sched.in_(2.6, b"doomed", routing_key="t.hop")  # 1 s rung, then a hop
        sched.cancel(doomed)
        ladder_backend.wait_until(lambda: sched.cancelled == 1, 20, "the message dropped at its first hop")
        assert (sched.hops, sched.delivered) == (0, 0)
        assert depth(conn, "t.hop") == 0 and depth(conn, "acemq.schedule.1s") == 0


def test_a_message_cancelled_while_the_relay_holds_it_is_dropped_at_its_due_time(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.held")
        doomed = sched.in_(4.0, b"doomed", routing_key="t.held")  # 1 s rung, then held for its last 3 s
        kept = sched.in_(4.0, b"kept", routing_key="t.held")
        ladder_backend.wait_until(lambda: len(_relay_of(sched).held) == 2, 20, "both held by the relay")
        sched.cancel(doomed)
        ladder_backend.wait_until(lambda: sched.cancelled == 1 and sched.delivered == 1, 20,
                                  "the held one dropped at its due time, its sibling delivered")
        (_, _, message), = Arrivals(ladder_backend, conn, "t.held").wait(1, 20)
        assert message.properties["message_id"] == kept
        assert depth(conn, "acemq.schedule.due") == 0


def test_a_relay_started_after_the_cancel_enforces_it(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        declare_target(conn, "t.later")
        with Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as publisher:
            doomed = publisher.in_(1.5, b"doomed", routing_key="t.later")
            kept = publisher.in_(1.5, b"kept", routing_key="t.later")
            kombu_ladder.cancel(conn, doomed)  # no scheduler needed
        with Scheduler.on(conn, clock=ladder_backend.clock) as relaying:
            arrivals = Arrivals(ladder_backend, conn, "t.later")
            (_, _, message), = arrivals.wait(1, 20)
            ladder_backend.wait_until(lambda: relaying.cancelled == 1, 20, "the cancelled one dropped")
            assert message.properties["message_id"] == kept
            assert arrivals.poll() == 1


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def _relay_warnings() -> Iterator[_Records]:
    """The relay's warnings, caught on its logger itself: another test may have stopped its propagation,
    or disabled it (a dictConfig of an earlier test)."""
    records = _Records()
    relay_logger = logging.getLogger("kombu_ladder.relay")
    was = relay_logger.disabled, relay_logger.level
    relay_logger.disabled = False
    relay_logger.setLevel(logging.WARNING)
    relay_logger.addHandler(records)
    try:
        yield records
    finally:
        relay_logger.removeHandler(records)
        relay_logger.disabled = was[0]
        relay_logger.setLevel(was[1])


def test_bad_records_on_the_stream_are_skipped_and_never_stop_a_relay(ladder_backend: Any) -> None:
    with _relay_warnings() as records:
        _bad_records(ladder_backend)
    skipped = [line for line in records.lines if line.startswith("skipping a record in ladder.cancellations")]
    assert len(skipped) == 5, records.lines


def _bad_records(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        declare_target(conn, "t.bad")
        channel = conn.channel()
        kombu_ladder.cancellation.stream.declare_stream(channel)
        for body in (b"\xff not json", b"[]", b'{"ladder": "cancel", "v": 1, "id": 5, "at": 1}', b"{" * 5000,
                     encode("x" * 200, at=1)[:-1]):
            channel.basic_publish(channel.prepare_message(body), exchange="", routing_key=STREAM)
        channel.close()
        with Scheduler.on(conn, clock=ladder_backend.clock) as sched:
            assert _relay_of(sched).cancels.skipped == 5
            doomed = sched.in_(1.2, b"doomed", routing_key="t.bad")
            sched.in_(1.2, b"kept", routing_key="t.bad")
            sched.cancel(doomed)
            ladder_backend.wait_until(lambda: sched.cancelled == 1 and sched.delivered == 1, 20, "relaying")


def test_producer_publish_keeps_the_callers_message_id(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.producer")
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish(b"mine", routing_key="t.producer", countdown=1.2, message_id="caller-id")
        producer.publish(b"other", routing_key="t.producer", countdown=1.2, message_id="drop-me")
        kombu_ladder.cancel(conn, "drop-me")
        (_, _, message), = Arrivals(ladder_backend, conn, "t.producer").wait(1, 20)
        assert message.properties["message_id"] == "caller-id"
        ladder_backend.wait_until(lambda: sched.cancelled == 1, 20, "drop-me dropped")


@pytest.mark.parametrize("given,error", [(None, TypeError), ("", ValueError), ("é" * 200, ValueError)])
def test_cancel_refuses_an_id_no_message_can_have(ladder_backend: Any, given: Any, error: type) -> None:
    with ladder_backend.connection() as conn:
        with pytest.raises(error, match="message_id"):
            kombu_ladder.cancel(conn, given)


def test_a_message_id_cancel_drops_a_celery_task_by_its_task_id_and_nothing_else(ladder_backend: Any) -> None:
    """One meaning for an id: kombu_ladder.cancel(TASK_ID) drops the Celery task message with that task id
    (its correlation_id), not a plain message whose correlation_id merely equals it (an RPC reply)."""
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.taskid")
        producer = LadderProducer(conn.default_channel, clock=ladder_backend.clock)
        producer.publish(b"task", routing_key="t.taskid", countdown=2.6, correlation_id="t-3",
                         headers={"task": "proj.add", "id": "t-3"})
        producer.publish(b"reply", routing_key="t.taskid", countdown=2.6, correlation_id="t-3")
        kombu_ladder.cancel(conn, "t-3")
        ladder_backend.wait_until(lambda: sched.cancelled == 1 and sched.delivered == 1, 20, "task dropped, reply sent")
        (_, _, message), = Arrivals(ladder_backend, conn, "t.taskid").wait(1, 20)
        assert message.body == b"reply"


def test_a_cancellation_spares_a_message_with_its_id_scheduled_after_it(ladder_backend: Any) -> None:
    """A record written two minutes ago (its clock says so) cancels what waited then, not a reuse of the id now."""
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.reuse")
        kombu_ladder.cancel(conn, "reuse-1", clock=lambda: ladder_backend.clock() - 120)
        sched.in_(2.6, b"reused", routing_key="t.reuse", message_id="reuse-1")  # 1 s rung, a hop, then held
        doomed = sched.in_(2.6, b"doomed", routing_key="t.reuse")
        sched.cancel(doomed)
        ladder_backend.wait_until(lambda: sched.cancelled == 1 and sched.delivered == 1, 20, "doomed dropped")
        (_, _, message), = Arrivals(ladder_backend, conn, "t.reuse").wait(1, 20)
        assert (message.properties["message_id"], message.body) == ("reuse-1", b"reused")


def test_bad_records_are_warned_about_a_few_at_a_time(ladder_backend: Any) -> None:
    """200,000 junk records once printed 200,000 warnings per relay start: now the relay's rate limit applies."""
    with _relay_warnings() as records, ladder_backend.connection() as conn:
        channel = conn.channel()
        kombu_ladder.cancellation.stream.declare_stream(channel)
        for n in range(200):
            channel.basic_publish(channel.prepare_message(b"junk %d" % n), exchange="", routing_key=STREAM)
        channel.close()
        with Scheduler.on(conn, clock=ladder_backend.clock) as sched:
            assert _relay_of(sched).cancels.skipped >= 200  # and any earlier test's, in this vhost
    skipped = [line for line in records.lines if line.startswith("skipping a record in ladder.cancellations")]
    assert len(skipped) == 5, records.lines
