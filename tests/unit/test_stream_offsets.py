"""The reader's view of a delivery's stream offset, from decoded headers or from raw properties (pure)."""

from __future__ import annotations

import pytest
from amqp.basic_message import Message

from kombu_ladder.controlplane.reader import offset_from_raw

pytestmark = pytest.mark.unit


def _raw(**properties: object) -> bytes:
    return Message(b"", **properties)._serialize_properties()


@pytest.mark.parametrize("raw,expected", [
    (_raw(application_headers={"x-stream-offset": 42}), 42),
    (_raw(application_headers={"x-stream-offset": 0}, content_type="application/json"), 0),
    (_raw(application_headers={"x-stream-offset": "42"}), None),  # not an integer
    (_raw(application_headers={"x-stream-offset": -1}), None),
    (_raw(application_headers={"x-stream-offset": True}), None),
    (_raw(application_headers={"other": 1}), None),
    (_raw(), None),
    (b"\x00\x00", None),
    (b"\xff\xff\x01", None),  # every flag set and nothing behind it: unreadable, not an error
    (None, None),
])
def test_the_offset_is_read_from_raw_properties_and_anything_else_is_unknown(raw: bytes, expected: object) -> None:
    assert offset_from_raw(raw) == expected
