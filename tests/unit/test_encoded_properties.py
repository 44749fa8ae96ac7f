"""Issue 24: a rung message's properties encoded by the ladder are the bytes py-amqp would have written."""

from __future__ import annotations

import enum
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from amqp.basic_message import Message as AmqpMessage
from amqp.serialization import dumps

from kombu_ladder import wire
from kombu_ladder.contract import MESSAGE_TYPE
from kombu_ladder.envelope import ORIGINAL_DELIVERY_MODE, scheduled_content_header, scheduled_headers


class Colour(enum.IntEnum):
    RED = 1


class Text(str):
    pass


#: Values py-amqp writes, each with a distinct encoding path; the ladder's encoder must agree byte for byte.
VALUES: list[Any] = [
    "", "plain", "héllo ☃", "\udcff surrogate", b"", b"\x00\xffraw", True, False, None, 0, 1, -1,
    2147483647, -2147483647, -2147483648, 2147483648, 2**63 - 1, -2**63, 1790000000000, 0.0, -1.5, 1e300,
    float("inf"), [], (), {}, [1, "a", None, [True, {"k": 2.5}]], ("t", 1), {"nested": {"deeper": [1, 2, {}]}},
]

#: Values py-amqp writes (or refuses) in its own way: the ladder leaves them to it.
UNCOMMON: list[Any] = [
    Decimal("1.25"), datetime(2030, 1, 1), Colour.RED, Text("sub"), 2**64, object(), {1: "int key"},
    {"x" * 256: "long name"}, [Decimal("1")], {"a": datetime(2030, 1, 1)},
]


def amqp_table(mapping: dict[str, Any]) -> bytes:
    """py-amqp's encoding of a table's contents (its 4-byte length left off)."""
    return dumps("F", [mapping])[4:]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_value_is_written_as_py_amqp_writes_it(value: Any) -> None:
    assert wire.py_table({"v": value}) == amqp_table({"v": value})
    assert wire.py_value(value) == amqp_table({"v": value})[2:]


def test_a_table_of_every_kind_is_written_as_py_amqp_writes_it() -> None:
    table = {f"k{i}": value for i, value in enumerate(VALUES)}
    table[b"bytes-name"] = "x"  # type: ignore[index]
    table["ü" * 127] = 1  # 254 bytes of UTF-8: the longest name there is
    assert wire.py_table(table) == amqp_table(table)


def _id(value: Any) -> str:
    """A test id the same in every process (xdist workers compare them): ``object()``'s repr has an address."""
    return "object()" if type(value) is object else repr(value)


@pytest.mark.parametrize("value", UNCOMMON, ids=_id)
def test_what_py_amqp_writes_its_own_way_is_refused(value: Any) -> None:
    with pytest.raises(wire.Unencodable):
        wire.py_table(value if isinstance(value, dict) else {"v": value})


@pytest.mark.parametrize("name,value,expected", [
    ("content_type", "application/json", b"\x10application/json"),
    ("message_id", b"\xff", b"\x01\xff"),
    ("reply_to", "", b"\x00"),
    ("priority", 9, b"\x09"),
    ("timestamp", 2**64 - 1, b"\xff" * 8),
])
def test_a_property_is_written_as_py_amqp_writes_it(name: str, value: Any, expected: bytes) -> None:
    assert wire.py_property(name, value) == expected
    assert AmqpMessage(**{name: value})._serialize_properties()[2:] == expected


@pytest.mark.parametrize("name,value", [
    ("content_type", "x" * 256), ("correlation_id", 5), ("priority", 256), ("priority", -1), ("priority", "9"),
    ("delivery_mode", True), ("timestamp", -1), ("timestamp", 2**64), ("timestamp", datetime(2030, 1, 1)),
])
def test_a_property_py_amqp_refuses_or_writes_its_own_way_is_refused(name: str, value: Any) -> None:
    with pytest.raises(wire.Unencodable):
        wire.py_property(name, value)


HEADERS: list[dict[str, Any]] = [
    {},
    {"app": "h", "n": 1},
    # what Celery's task protocol 2 carries
    {"lang": "py", "task": "proj.add", "id": "0f6c", "shadow": None, "eta": "2030-01-01T00:00:00+00:00",
     "expires": None, "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
     "root_id": "0f6c", "parent_id": None, "argsrepr": "(1, 2)", "kwargsrepr": "{}", "origin": "gen1@host",
     "ignore_result": False, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {}},
    {"compression": "application/x-gzip", "big": 2**40, "f": 0.5, "nested": {"l": [1, "two"]}},
]

PROPERTIES: list[dict[str, Any]] = [
    {},
    {"correlation_id": "c-1", "reply_to": ""},
    {"correlation_id": "c", "reply_to": "r", "message_id": b"m", "timestamp": 1790000000, "user_id": "guest",
     "app_id": "a", "cluster_id": "cl"},
    {"app_id": "only-after-type"},
]


@pytest.mark.parametrize("headers", HEADERS, ids=range(len(HEADERS)))
@pytest.mark.parametrize("properties", PROPERTIES, ids=range(len(PROPERTIES)))
@pytest.mark.parametrize("content_type,content_encoding,priority,mode", [
    ("application/json", "utf-8", 0, 2),
    ("application/json", "binary", None, 1),
    (None, None, 9, None),
    ("text/plain; charset=ü", "utf-8", 255, 1),
])
def test_the_rung_message_is_encoded_as_py_amqp_encodes_it(
    headers: dict[str, Any], properties: dict[str, Any], content_type: Any, content_encoding: Any, priority: Any,
    mode: Any,
) -> None:
    target = {"exchange": "billing", "routing_key": "invoice.due"}
    for due in (1790000000123, 5, 2**31):
        expected = AmqpMessage(
            priority=priority, content_type=content_type, content_encoding=content_encoding,
            application_headers=scheduled_headers(headers, **target, due_at=due, content_type=content_type,
                                                  delivery_mode=mode),
            delivery_mode=2, type=MESSAGE_TYPE, **properties,
        )._serialize_properties()
        assert scheduled_content_header(headers, properties, **target, due_at=due, content_type=content_type,
                                        content_encoding=content_encoding, delivery_mode=mode,
                                        priority=priority) == expected


@pytest.mark.parametrize("headers,properties,priority", [
    ({"x-schedule-due-at": 1}, {}, 0),               # the publisher's own copy of a header the ladder writes
    ({ORIGINAL_DELIVERY_MODE: 1}, {}, 0),
    ({"when": datetime(2030, 1, 1)}, {}, 0),          # a type py-amqp writes its own way
    ({"amount": Decimal("9.99")}, {}, 0),
    ({}, {"correlation_id": 42}, 0),                  # a property py-amqp refuses
    ({}, {"unknown_property": "x"}, 0),               # py-amqp drops it; kombu may complain
    ({}, {}, "high"),
    ({}, {}, [1]),                                    # unhashable
])
def test_what_py_amqp_must_encode_is_left_to_it(headers: dict[str, Any], properties: dict[str, Any],
                                                priority: Any) -> None:
    assert scheduled_content_header(headers, properties, exchange="", routing_key="q", due_at=1, content_type=None,
                                    content_encoding=None, delivery_mode=2, priority=priority) is None
