"""Pure tables for the envelope rules: where one expired message goes, and what a scheduled one carries."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kombu_ladder.envelope import (
    ORIGINAL_DELIVERY_MODE,
    Deliver,
    Hop,
    Park,
    decide,
    scheduled_headers,
)

NOW = 1_700_000_000_000


def scheduled(due: object = NOW, **extra: Any) -> dict[str, Any]:
    headers = {
        "x-schedule-exchange": "billing",
        "x-schedule-routing-key": "invoice.due",
        "x-schedule-due-at": due,
        "x-schedule-content-type": "application/json",
    }
    headers.update(extra)
    return headers


@pytest.mark.parametrize(
    "due,expected",
    [
        (NOW, Deliver),
        (NOW - 60_000, Deliver),
        (NOW + 999, Deliver),
        (NOW + 1000, Hop),
        (str(NOW + 5000), Hop),
        (f" {NOW} ", Deliver),
        (NOW + 90_000, Hop),
    ],
)
def test_decide_deliver_or_hop(due: object, expected: type) -> None:
    assert type(decide(scheduled(due), NOW)) is expected


@pytest.mark.parametrize(
    "remaining_ms,rung,queue",
    [
        (1000, 1, "acemq.schedule.1s"),
        (9999, 1, "acemq.schedule.1s"),
        (10_000, 10, "acemq.schedule.10s"),
        (90_000, 60, "acemq.schedule.1m"),
        (600_000, 600, "acemq.schedule.10m"),
        (4 * 3_600_000, 3600, "acemq.schedule.1h"),
    ],
)
def test_hop_goes_to_the_largest_rung_that_does_not_overshoot(remaining_ms: int, rung: int, queue: str) -> None:
    decision = decide(scheduled(NOW + remaining_ms), NOW)
    assert isinstance(decision, Hop)
    assert (decision.rung, decision.queue) == (rung, queue)


@pytest.mark.parametrize(
    "headers,reason",
    [
        (None, "malformed: the message has no headers"),
        ({}, "malformed: the message has no headers"),
        ({"x-schedule-exchange": "billing", "x-schedule-routing-key": "k"},
         "malformed: header x-schedule-due-at is missing"),
        (scheduled("abc"), "malformed: header x-schedule-due-at is not an integer"),
        (scheduled(True), "malformed: header x-schedule-due-at is not an integer"),
        (scheduled(False), "malformed: header x-schedule-due-at is not an integer"),
        (scheduled(None), "malformed: header x-schedule-due-at is not an integer"),
        (scheduled("1.5"), "malformed: header x-schedule-due-at is not an integer"),
        (scheduled(1.5), "malformed: header x-schedule-due-at is not an integer"),
        (scheduled(-1), "malformed: header x-schedule-due-at is negative"),
        (scheduled(NOW * 1000), "malformed: header x-schedule-due-at=.* is more than .*max_delay.*microseconds"),
        ({"x-schedule-routing-key": "k", "x-schedule-due-at": NOW}, "malformed: header x-schedule-exchange is missing"),
        (scheduled(**{"x-schedule-exchange": 5}), "malformed: header x-schedule-exchange is not a string"),
        ({"x-schedule-exchange": "b", "x-schedule-due-at": NOW}, "malformed: header x-schedule-routing-key is missing"),
        (scheduled(**{"x-schedule-routing-key": None}), "malformed: header x-schedule-routing-key is not a string"),
        (scheduled(**{"x-schedule-routing-key": b"\xff"}), "malformed: header x-schedule-routing-key is not a string"),
        (scheduled(**{"x-schedule-exchange": "", "x-schedule-routing-key": ""}),
         "malformed: header x-schedule-routing-key is empty for the default exchange"),
    ],
)
def test_decide_parks_with_a_reason(headers: Any, reason: str) -> None:
    decision = decide(headers, NOW)
    assert isinstance(decision, Park)
    assert re.match(reason, decision.reason), decision.reason


def test_decide_hops_a_foreign_message_due_years_ahead_an_hour_at_a_time() -> None:
    decision = decide(scheduled(NOW + 2 * 365 * 86_400_000), NOW)
    assert isinstance(decision, Hop) and decision.rung == 3600


def test_decide_parks_past_the_max_delay_it_is_given() -> None:
    assert isinstance(decide(scheduled(NOW + 61_000), NOW, max_delay_ms=61_000), Hop)
    decision = decide(scheduled(NOW + 61_001), NOW, max_delay_ms=61_000)
    assert isinstance(decision, Park) and "max_delay of 61s" in decision.reason


def test_decide_parks_an_exchange_refused_by_the_allow_list() -> None:
    decision = decide(scheduled(), NOW, allow_exchange=lambda name: name == "other")
    assert decision == Park("refused: target exchange 'billing' is not in the relay's allow-list")
    assert isinstance(decide(scheduled(), NOW, allow_exchange=lambda name: name == "billing"), Deliver)


def test_empty_routing_key_is_fine_for_a_named_exchange() -> None:
    decision = decide(scheduled(**{"x-schedule-routing-key": ""}), NOW)
    assert isinstance(decision, Deliver)
    assert (decision.exchange, decision.routing_key) == ("billing", "")


def test_bytes_target_headers_are_decoded() -> None:
    headers = scheduled(**{"x-schedule-exchange": b"billing", "x-schedule-routing-key": b"invoice.due",
                           "x-schedule-content-type": b"text/plain"})
    decision = decide(headers, NOW)
    assert isinstance(decision, Deliver)
    assert (decision.exchange, decision.routing_key) == ("billing", "invoice.due")


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"exchange": "billing", "routing_key": "k", "due_at": 5, "content_type": "application/json"},
         {"app": 1, "x-schedule-exchange": "billing", "x-schedule-routing-key": "k",
          "x-schedule-due-at": 5, "x-schedule-content-type": "application/json"}),
        ({"exchange": "", "routing_key": "q", "due_at": 7, "content_type": None, "delivery_mode": 1},
         {"app": 1, "x-schedule-exchange": "", "x-schedule-routing-key": "q", "x-schedule-due-at": 7,
          "x-schedule-content-type": "application/octet-stream", ORIGINAL_DELIVERY_MODE: 1}),
        ({"exchange": "e", "routing_key": "q", "due_at": 7, "content_type": "text/plain", "delivery_mode": 2},
         {"app": 1, "x-schedule-exchange": "e", "x-schedule-routing-key": "q", "x-schedule-due-at": 7,
          "x-schedule-content-type": "text/plain"}),
    ],
)
def test_scheduled_headers(kwargs: dict, expected: dict) -> None:
    assert scheduled_headers({"app": 1}, **kwargs) == expected


def test_the_decision_is_given_values_and_calls_nothing_of_the_relay() -> None:
    """Only the user's allow-list predicate may be a callable; the relay passes no lambda into the decision."""
    import ast
    import inspect
    from pathlib import Path

    import kombu_ladder.relay.core as core

    callables = [name for name, p in inspect.signature(decide).parameters.items() if "Callable" in str(p.annotation)]
    assert callables == ["allow_exchange"]
    tree = ast.parse(Path(core.__file__).read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", getattr(node.func, "attr", None)) == "decide"]
    assert calls, "relay/core.py decides through envelope.decide"
    for call in calls:
        given = [*call.args, *(k.value for k in call.keywords)]
        assert not [g for g in given if isinstance(g, ast.Lambda)], "a lambda passed into the decision"
        assert [k.arg for k in call.keywords if k.arg == "allow_exchange"] == ["allow_exchange"]
