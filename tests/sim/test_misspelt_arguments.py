"""Issue 40: a misspelt publish keyword and an absurd Celery countdown are refused, naming the argument,
before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Queue

from kombu_ladder import LadderProducer, Scheduler
from kombu_ladder.contract import RUNGS, rung_name
from kombu_ladder.producer import AMQP_PROPERTIES
from kombu_ladder.simulator import SimulatedBroker


def _waiting(broker: SimulatedBroker) -> int:
    return sum(len(broker.messages(rung_name(rung))) for rung in RUNGS) + len(broker.messages("q"))


@pytest.mark.parametrize("keyword", ["contdown", "key", "countdwon", "ttl", "x_delay"])
def test_a_keyword_neither_kombu_nor_the_ladder_takes_raises_naming_it(keyword: str) -> None:
    broker = SimulatedBroker(start=1_800_000_000)
    with broker.connection() as conn:
        Queue("q", durable=True)(conn.default_channel).declare()
        with Scheduler.on(conn, relay=False) as scheduler:
            with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
                scheduler.in_(5, b"x", routing_key="q", **{keyword: 5})
            with pytest.raises(TypeError, match=f"'{keyword}'"):
                LadderProducer(conn.default_channel).publish(b"x", routing_key="q", **{keyword: 5})
        assert _waiting(broker) == 0  # nothing was sent, not even at once


def test_kombu_arguments_and_amqp_properties_are_still_accepted() -> None:
    broker = SimulatedBroker(start=1_800_000_000)
    with broker.connection() as conn:
        Queue("q", durable=True)(conn.default_channel).declare()
        with Scheduler.on(conn, relay=False) as scheduler:
            scheduler.in_(5, {"a": 1}, routing_key="q", serializer="json", headers={"h": 1}, priority=3,
                          correlation_id="c", reply_to="r", app_id="app", timestamp=1, retry=True,
                          content_encoding="utf-8")
        assert _waiting(broker) == 1
    assert {"message_id", "correlation_id", "reply_to", "expiration", "priority", "type"} <= AMQP_PROPERTIES


def test_an_absurd_celery_countdown_is_a_value_error_naming_countdown_and_the_maximum() -> None:
    celery = pytest.importorskip("celery")
    import celery_ladder

    app = celery.Celery("absurd", broker="memory://", set_as_current=False)
    celery_ladder.install(app)
    sent: list[Any] = []
    app.amqp.send_task_message = lambda *args, **kwargs: sent.append(args)  # nothing may reach it

    @app.task(shared=False)
    def noop() -> None:
        """Never sent."""

    for countdown in (10**12, 10**10):
        with pytest.raises(ValueError, match=r"countdown=\d+s is longer than the maximum delay of 315619200s"):
            noop.apply_async(countdown=countdown)
    app.conf.ladder_max_delay = 60
    with pytest.raises(ValueError, match=r"countdown=61s is longer than the maximum delay of 60s"):
        noop.apply_async(countdown=61)
    assert sent == []
    noop.apply_async(countdown=30)  # within the limit: sent
    assert len(sent) == 1
