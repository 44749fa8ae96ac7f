"""Pure tables for the AceMQ contract: names, describe, rung_name and arguments_for."""

from __future__ import annotations

import pytest

from kombu_ladder import contract


@pytest.mark.parametrize(
    "given,expected",
    [
        (3600, "1h"),
        (600, "10m"),
        (60, "1m"),
        (10, "10s"),
        (1, "1s"),
        (7200, "2h"),
        (86400, "24h"),
        (120, "2m"),
        (90, "90s"),
        (5400, "90m"),
        (3660, "61m"),
        (3601, "3601s"),
        (59, "59s"),
        (1.5, "1s"),
        (0.5, "0s"),
        (0, "0h"),
        (2.5, "2s"),
        # Ruby's (seconds * 1000).round rounds half away from zero: 0.5 ms -> 1 ms -> "0s".
        (0.0005, "0s"),
    ],
)
def test_describe(given: float, expected: str) -> None:
    assert contract.describe(given) == expected


@pytest.mark.parametrize(
    "given,expected",
    [
        (3600, "acemq.schedule.1h"),
        (600, "acemq.schedule.10m"),
        (60, "acemq.schedule.1m"),
        (10, "acemq.schedule.10s"),
        (1, "acemq.schedule.1s"),
        (30, "acemq.schedule.30s"),
    ],
)
def test_rung_name(given: int, expected: str) -> None:
    assert contract.rung_name(given) == expected


@pytest.mark.parametrize(
    "given,expected",
    [
        (3600, {"x-message-ttl": 3600000, "x-dead-letter-exchange": "acemq.schedule",
                "x-dead-letter-routing-key": "acemq.schedule.due"}),
        (10, {"x-message-ttl": 10000, "x-dead-letter-exchange": "acemq.schedule",
              "x-dead-letter-routing-key": "acemq.schedule.due"}),
        (1, {"x-message-ttl": 1000, "x-dead-letter-exchange": "acemq.schedule",
             "x-dead-letter-routing-key": "acemq.schedule.due"}),
        (1.5, {"x-message-ttl": 1500, "x-dead-letter-exchange": "acemq.schedule",
               "x-dead-letter-routing-key": "acemq.schedule.due"}),
        # Ruby's Float#round rounds half away from zero (Python's round would give 2).
        (0.0025, {"x-message-ttl": 3, "x-dead-letter-exchange": "acemq.schedule",
                  "x-dead-letter-routing-key": "acemq.schedule.due"}),
    ],
)
def test_arguments_for(given: float, expected: dict) -> None:
    assert contract.arguments_for(given) == expected
    assert type(contract.arguments_for(given)["x-message-ttl"]) is int


@pytest.mark.parametrize(
    "given,expected",
    [
        ("EXCHANGE", "acemq.schedule"),
        ("EXCHANGE_TYPE", "direct"),
        ("CONTROL", "acemq.schedule.due"),
        ("RUNGS", (3600, 600, 60, 10, 1)),
        ("MESSAGE_TYPE", "ScheduledMessage"),
        ("PREFETCH", 50),
        ("TARGET_EXCHANGE", "x-schedule-exchange"),
        ("TARGET_ROUTING_KEY", "x-schedule-routing-key"),
        ("DUE_AT", "x-schedule-due-at"),
        ("CONTENT_TYPE", "x-schedule-content-type"),
        ("PARKING", "acemq.schedule.parked"),
        ("PARKED_REASON", "x-ladder-parked-reason"),
        ("PARKED_AT", "x-ladder-parked-at"),
        ("ORIGINAL_ROUTING_KEY", "x-ladder-original-routing-key"),
        ("REPUBLISH_COUNT", "x-ladder-republish-count"),
    ],
)
def test_contract_values(given: str, expected: object) -> None:
    assert getattr(contract, given) == expected


def test_rung_names_longest_first() -> None:
    assert contract.rung_names() == [
        "acemq.schedule.1h", "acemq.schedule.10m", "acemq.schedule.1m",
        "acemq.schedule.10s", "acemq.schedule.1s",
    ]


def test_no_header_uses_the_reserved_prefix() -> None:
    names = [*contract.SCHEDULE_HEADERS, contract.PARKED_REASON, contract.PARKED_AT,
             contract.ORIGINAL_ROUTING_KEY, contract.REPUBLISH_COUNT]
    assert not [n for n in names if n.startswith("x-acemq-")]
