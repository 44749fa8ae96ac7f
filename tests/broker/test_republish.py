"""Scheduler.republish: a consumer asks for a message again later, at the back of its queue."""

from __future__ import annotations

import math
from typing import Any

import pytest
from backends import declare_target, depth, get
from kombu import Producer

from kombu_ladder import Scheduler, original_routing_key, republish_count


def publish_jobs(conn: Any, *bodies: Any) -> None:
    producer = Producer(conn.default_channel)
    for body in bodies:
        producer.publish(body, exchange="t.jobs", routing_key="job.created", headers={"app": "h"},
                         correlation_id=f"corr-{body['n']}", priority=4)


def test_republish_rounds_come_back_to_the_back_of_the_queue(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.work", exchange="t.jobs", routing_key="job.created")
        publish_jobs(conn, {"n": 1}, {"n": 2})
        first = ladder_backend.wait_until(lambda: get(conn, "t.work", no_ack=False), 10, "job 1")
        assert first.decode() == {"n": 1}
        assert (original_routing_key(first), republish_count(first)) == ("job.created", 0)

        assert sched.republish(first, 1.2, queue="t.work") == 1
        assert first.acknowledged
        second = get(conn, "t.work")
        assert second is not None and second.decode() == {"n": 2}  # job 2 is now ahead of job 1

        for round_ in (1, 2, 3):
            again = ladder_backend.wait_until(lambda: get(conn, "t.work", no_ack=False), 20, f"round {round_}")
            assert again.decode() == {"n": 1}
            assert again.content_type == "application/json"
            assert again.delivery_info["routing_key"] == "t.work"  # came by the default exchange
            assert original_routing_key(again) == "job.created"
            assert republish_count(again) == round_
            assert again.headers["app"] == "h"
            assert again.headers["x-ladder-republish-count"] == round_
            assert again.headers["x-ladder-original-routing-key"] == "job.created"
            assert not [k for k in again.headers if k.startswith(("x-schedule-", "x-death", "x-first-death",
                                                                   "x-last-death"))]
            assert again.properties["correlation_id"] == "corr-1"
            assert again.properties["priority"] == 4
            if round_ < 3:
                assert sched.republish(again, 1.2, queue="t.work") == round_ + 1
            else:
                again.ack()  # a consumer gives up (or succeeds) after N rounds
        assert get(conn, "t.work") is None
        assert sched.scheduled == 3


def test_the_original_is_acked_only_once_the_copy_is_confirmed(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.work", exchange="t.jobs", routing_key="job.created")
        publish_jobs(conn, {"n": 1})
        message = ladder_backend.wait_until(lambda: get(conn, "t.work", no_ack=False), 10, "job 1")
        seen_at_ack: list[int] = []
        real_ack = message.ack

        def ack(*args: Any, **kwargs: Any) -> None:
            with ladder_backend.connection() as other:  # what the broker holds, seen from elsewhere
                seen_at_ack.append(depth(other, "acemq.schedule.10s"))
            real_ack(*args, **kwargs)

        message.ack = ack
        sched.republish(message, 30, queue="t.work")
        assert seen_at_ack == [1]
        copy = get(conn, "acemq.schedule.10s")
        assert copy.headers["x-schedule-exchange"] == ""
        assert copy.headers["x-schedule-routing-key"] == "t.work"
        assert copy.headers["x-ladder-republish-count"] == 1


@pytest.mark.parametrize(
    "delay,queue,error,name",
    [
        (math.nan, "t.work", ValueError, "delay|countdown"),
        (None, "t.work", TypeError, "delay|countdown"),
        ("5", "t.work", TypeError, "delay|countdown"),
        (5, "", ValueError, "queue"),
        (5, None, ValueError, "queue"),
    ],
)
def test_bad_republish_leaves_the_original_unacked(
    ladder_backend: Any, delay: Any, queue: Any, error: type, name: str
) -> None:
    with ladder_backend.connection() as conn, Scheduler.on(conn, relay=False, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.work", exchange="t.jobs", routing_key="job.created")
        publish_jobs(conn, {"n": 1})
        message = ladder_backend.wait_until(lambda: get(conn, "t.work", no_ack=False), 10, "job 1")
        with pytest.raises(error, match=name):
            sched.republish(message, delay, queue=queue)
        assert not message.acknowledged
        assert sched.scheduled == 0
        assert get(conn, "t.work") is None
        message.requeue()
        assert ladder_backend.wait_until(lambda: get(conn, "t.work"), 10, "the requeued job").decode() == {"n": 1}


def test_a_compressed_message_is_republished_with_the_bytes_it_came_with(ladder_backend: Any) -> None:
    """kombu decompresses on receipt; the copy carries the compression header, so it must be compressed again."""
    with ladder_backend.connection() as conn, Scheduler.on(conn, clock=ladder_backend.clock) as sched:
        declare_target(conn, "t.zipped")
        Producer(conn.default_channel).publish({"big": "x" * 3000}, routing_key="t.zipped", compression="zlib")
        first = ladder_backend.wait_until(lambda: get(conn, "t.zipped", no_ack=False), 10, "the original")
        sched.republish(first, 1.2, queue="t.zipped")
        again = ladder_backend.wait_until(lambda: get(conn, "t.zipped"), 20, "the copy")
        assert again.headers["compression"] == "application/x-gzip" and not again.errors
        assert again.decode() == {"big": "x" * 3000}
