"""When a message entered the rung it left, from its x-death (pure)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import amqp
import pytest

from kombu_ladder import wire
from kombu_ladder.deaths import entered_rung_ms
from kombu_ladder.relay.outgoing import Headers

DIED = datetime(2026, 12, 2, 5, 0, 0)  # as py-amqp reads a timestamp: naive, in UTC
DIED_MS = 1_796_187_600_000


def _death(queue: Any = "acemq.schedule.10s", time: Any = DIED, **extra: Any) -> dict[str, Any]:
    return {"count": 1, "reason": "expired", "queue": queue, "time": time, "exchange": "acemq.schedule",
            "routing-keys": [queue if isinstance(queue, str) else "x"], **extra}


def _wire_view(headers: dict[str, Any]) -> Headers:
    """The relay's view of these headers, read from the bytes py-amqp writes."""
    raw = amqp.Message(b"", application_headers=headers)._serialize_properties()
    table = wire.read_properties(raw).headers
    assert table is not None
    return Headers(table)


@pytest.mark.parametrize("given,expected", [
    ({"x-death": [_death()]}, DIED_MS - 10_000),
    ({"x-death": [_death("acemq.schedule.1h")]}, DIED_MS - 3_600_000),
    ({"x-death": [_death("acemq.schedule.1s"), _death("acemq.schedule.1h", datetime(2020, 1, 1))]}, DIED_MS - 1000),
    ({"x-death": [_death("billing")]}, None),  # not a rung: its TTL is unknown
    ({"x-death": [_death(time="yesterday")]}, None),
    ({"x-death": [_death(time=5)]}, None),  # a number is not a timestamp
    ({"x-death": []}, None),
    ({"x-death": "a string"}, None),
    ({"x-death": [7]}, None),
    ({}, None),
])
def test_the_rung_entry_is_its_death_minus_its_ttl(given: dict[str, Any], expected: Any) -> None:
    assert entered_rung_ms(_wire_view(given)) == expected
    assert entered_rung_ms(given) == expected  # plain decoded headers read the same


def test_no_headers_and_a_truncated_array_are_unknown() -> None:
    assert entered_rung_ms(None) is None
    assert entered_rung_ms({"x-death": wire.Nested(b"A\x00\x00\x00\x09F\x00\x00\x00\x09\x05qu")}) is None
