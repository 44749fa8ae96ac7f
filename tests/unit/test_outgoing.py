"""Pure tables for what the relay publishes: the bytes of a delivery and of a hop, read back as a client reads them."""

from __future__ import annotations

from typing import Any

import pytest
from hostile_corpus import relayed

from kombu_ladder.envelope import ORIGINAL_DELIVERY_MODE, scheduled_headers

NOW = 1_700_000_000_000


def scheduled(due: int = NOW, **extra: Any) -> dict[str, Any]:
    """Headers as our producer writes them (to billing/invoice.due, JSON), ``extra`` on top."""
    return {**scheduled_headers({}, exchange="billing", routing_key="invoice.due", due_at=due,
                                content_type="application/json"), **extra}


DEATH = {
    "x-death": [{"queue": "acemq.schedule.10s", "reason": "expired", "count": 1}],
    "x-first-death-exchange": "acemq.schedule",
    "x-first-death-queue": "acemq.schedule.10s",
    "x-first-death-reason": "expired",
    "x-last-death-exchange": "acemq.schedule",
    "x-last-death-queue": "acemq.schedule.10s",
    "x-last-death-reason": "expired",
}

RUNG_PROPS = {
    "content_type": "application/octet-stream",
    "content_encoding": "utf-8",
    "correlation_id": "corr-1",
    "reply_to": "replies",
    "message_id": "msg-1",
    "priority": 3,
    "type": "ScheduledMessage",
    "delivery_mode": 2,
    "app_id": "billing-app",
}


def test_delivery_strips_schedule_and_death_headers_and_keeps_the_rest() -> None:
    headers = scheduled(**DEATH, **{"app": "yes", "x-custom": 1, "x-deathly": "kept",
                                    ORIGINAL_DELIVERY_MODE: 1})
    delivered, _ = relayed("deliver", headers, RUNG_PROPS)
    assert delivered == {"app": "yes", "x-custom": 1, "x-deathly": "kept"}


def test_delivery_properties_restore_what_the_publisher_sent() -> None:
    _, properties = relayed("deliver", scheduled(**{ORIGINAL_DELIVERY_MODE: 1}),
                            {**RUNG_PROPS, "expiration": "5000", "user_id": "guest"})
    assert properties == {
        "content_type": "application/json",  # from x-schedule-content-type, not the rung's property
        "content_encoding": "utf-8",
        "correlation_id": "corr-1",
        "reply_to": "replies",
        "message_id": "msg-1",
        "priority": 3,
        "app_id": "billing-app",
        "delivery_mode": 1,
    }


def test_the_content_type_header_given_as_bytes_is_delivered_as_the_content_type() -> None:
    _, properties = relayed("deliver", scheduled(**{"x-schedule-content-type": b"text/plain"}), RUNG_PROPS)
    assert properties["content_type"] == "text/plain"


@pytest.mark.parametrize(
    "extra,mode",
    [({}, 2), ({ORIGINAL_DELIVERY_MODE: 2}, 2), ({ORIGINAL_DELIVERY_MODE: 1}, 1), ({ORIGINAL_DELIVERY_MODE: 7}, 2)],
)
def test_delivery_mode_defaults_to_persistent(extra: dict, mode: int) -> None:
    _, properties = relayed("deliver", scheduled(**extra), RUNG_PROPS)
    assert properties["delivery_mode"] == mode


def test_missing_content_type_header_keeps_the_message_property() -> None:
    headers = scheduled()
    del headers["x-schedule-content-type"]
    _, properties = relayed("deliver", headers, {**RUNG_PROPS, "content_type": "text/csv"})
    assert properties["content_type"] == "text/csv"


def test_hop_keeps_schedule_headers_strips_death_and_never_expires() -> None:
    headers = scheduled(NOW + 30_000, **DEATH, app="yes")
    hopped, properties = relayed("hop", headers, {**RUNG_PROPS, "expiration": "1000"})
    assert hopped == scheduled(NOW + 30_000, app="yes")
    assert properties["type"] == "ScheduledMessage"
    assert properties["delivery_mode"] == 2
    assert "expiration" not in properties
    assert properties["correlation_id"] == "corr-1"
    assert properties["priority"] == 3


@pytest.mark.parametrize(
    "given,expected",
    [
        ({"a": 1, **scheduled()}, {"a": 1}),
        ({"x-death": [], "x-first-death-queue": "q", "x-last-death-reason": "expired"}, {}),
        ({ORIGINAL_DELIVERY_MODE: 1, "b": "2"}, {"b": "2"}),
        ({"x-acemq-first-seen": 5}, {"x-acemq-first-seen": 5}),
    ],
)
def test_strip_for_delivery(given: dict, expected: dict) -> None:
    delivered, _ = relayed("deliver", given, {})
    assert delivered == expected


def test_scheduled_properties() -> None:
    given = {"content_type": "application/json", "correlation_id": "c", "expiration": "100",
             "type": "mine", "delivery_mode": 1, "user_id": "guest", "priority": None}
    _, properties = relayed("hop", {}, given)
    assert properties == {
        "content_type": "application/json", "correlation_id": "c",
        "type": "ScheduledMessage", "delivery_mode": 2,
    }
