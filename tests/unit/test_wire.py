"""Pure tables: content headers as bytes (kombu_ladder.wire), escaped text, rate-limited notices, the exchange check."""

from __future__ import annotations

import logging
import struct
from decimal import Decimal
from typing import Any

import hostile_corpus as corpus
import pytest
from amqp.basic_message import Message as AmqpMessage

from kombu_ladder import readable, wire
from kombu_ladder.notices import Notices
from kombu_ladder.simulator import SimulatedBroker
from kombu_ladder.targets import ExchangeCheck, name_problem
from kombu_ladder.text import escape, quote


@pytest.mark.parametrize("item,expected", [
    (corpus.text("héllo"), "héllo"),
    (corpus.text(b"\xff\xfe"), b"\xff\xfe"),
    (corpus.long64(-5), -5),
    (b"T" + struct.pack(">Q", 2**64 - 1), 2**64 - 1),
    (b"s" + struct.pack(">h", -2), -2),
    (b"f" + struct.pack(">f", 1.5), 1.5),
    (b"t\x01", True),
    (b"V", None),
    (b"D\x02" + struct.pack(">i", 12345), Decimal("123.45")),
    (b"x\x00\x00\x00\x02\x00\xff", b"\x00\xff"),
    (corpus.ftable([(b"a", b"V")]), wire.Nested(corpus.ftable([(b"a", b"V")]))),
])
def test_decode_reads_one_value_leniently_and_never_recurses(item: bytes, expected: Any) -> None:
    assert wire.decode(item) == expected


@pytest.mark.parametrize("raw", [
    b"",  # no flags
    b"\x80\x00\x05ab",  # a short string longer than what follows
    b"\x20\x00\x00\x00\x00\x05\x01aZ",  # an unknown field type
    b"\x20\x00\x00\x00\x00\x07\x01aS\x00\x00\x00\x09",  # a long string running past its table
    b"\x00\x01",  # a flag bit the basic class does not define
    b"\x00\x00\x00",  # a byte after the last property
])
def test_malformed_property_lists_raise_wire_error(raw: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.read_properties(raw)


def test_py_amqp_encodings_read_and_write_back_byte_for_byte() -> None:
    message = AmqpMessage(b"", content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                          priority=9, correlation_id="c", reply_to="r", expiration="10", message_id="m",
                          timestamp=5, type="t", user_id="guest", app_id="a", cluster_id="cl",
                          application_headers={"a": 1, "b": [1, "x", {"c": None}], "d": 2.5, "e": True})
    raw = message._serialize_properties()
    props = wire.read_properties(raw)
    assert wire.write_properties(props) == raw
    assert props.fields["user_id"] == b"guest" and [n for n, _ in props.headers or ()] == [b"a", b"b", b"d", b"e"]


@pytest.mark.parametrize("props,problem", [
    (wire.Properties({"content_type": b"\xff"}), "property content_type is not valid UTF-8"),
    (wire.Properties(headers=[(b"\xff", b"V")]), "a header name is not valid UTF-8"),
    (wire.Properties(headers=[(b"a", corpus.ftable([(b"\xff", b"V")]))]), "a nested header name is not valid UTF-8"),
    (wire.Properties(headers=[(b"a", corpus.farray([b"T" + struct.pack(">Q", 253_402_300_800)]))]),
     "a header holds a timestamp after the year 9999"),
    (wire.Properties(headers=[(b"a", corpus.nested(100, "F"))]), "nested deeper than 100 levels"),
    (wire.Properties(headers=[(b"a", b"A\x00\x00\x00\x02Z")]), "the header table is malformed"),
])
def test_problem_says_what_no_client_could_read(props: wire.Properties, problem: str) -> None:
    assert problem in (readable.problem(props) or "")


@pytest.mark.parametrize("props", [
    wire.Properties({"content_type": "téxt".encode()}, [(b"a", corpus.nested(99, "A"))]),
    wire.Properties(headers=[(b"a", corpus.text(b"\xff binary values are fine"))]),
    wire.Properties(headers=[(b"t", b"T" + struct.pack(">Q", 253_402_300_799))]),
])
def test_problem_accepts_what_py_amqp_reads(props: wire.Properties) -> None:
    assert readable.problem(props) is None
    corpus.decoded(wire.write_properties(props))  # py-amqp agrees


def test_write_properties_refuses_what_the_wire_cannot_carry() -> None:
    with pytest.raises(wire.WireError, match="content_type"):
        wire.write_properties(wire.Properties({"content_type": b"t" * 256}))
    with pytest.raises(wire.WireError, match="header name"):
        wire.write_properties(wire.Properties(headers=[(b"n" * 256, b"V")]))


@pytest.mark.parametrize("given,expected", [
    ("plain text", "plain text"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("line\nbreak\x00", "line\\x0abreak\\x00"),
    ("rtl \u202e override", "rtl \\u202e override"),
    ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
    (b"bytes \xff\x1b", "bytes \\xff\\x1b"),
    ("x" * 310, "x" * 300 + "...(10 more)"),
])
def test_escape_makes_text_printable_and_bounded(given: Any, expected: str) -> None:
    assert escape(given) == expected
    assert escape(given).isprintable()


def test_quote_escapes_between_quotes() -> None:
    assert quote("a\tb") == "'a\\x09b'"


@pytest.mark.parametrize("what,name,problem", [
    ("routing key", "k" * 255, None),
    ("routing key", "k" * 256, "256 bytes"),
    ("exchange", "é" * 128, "256 bytes"),
    ("exchange", "\ud800" * 85, None),  # 255 bytes as py-amqp sends it (surrogatepass)
])
def test_name_problem_counts_bytes_of_utf8(what: str, name: str, problem: Any) -> None:
    found = name_problem(what, name)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_notices_log_a_burst_per_kind_and_window_then_one_summary(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    notices = Notices(logging.getLogger("t.notices"), window=10, burst=3, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.notices"):
        for n in range(1000):
            notices.warn("malformed", "parked %d", n)
        notices.warn("unroutable", "other kind")
        now[0] = 10.5
        notices.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["parked 0", "parked 1", "parked 2", "other kind",
                     "997 more malformed warning(s) like the above in the last 10 s (not logged one by one)"]


def test_the_exchange_check_remembers_answers_and_a_storm_asks_rarely() -> None:
    broker = SimulatedBroker()
    now = [0.0]
    with broker.connection() as conn:
        conn.default_channel.exchange_declare("ok.x", "direct", durable=True, auto_delete=False)
        check = ExchangeCheck(broker.connection(), clock=lambda: now[0])
        assert check("ok.x") is None and check("ok.x") is None and check.asked == 1
        for _ in range(100):  # a storm: the negative answer is used while messages keep coming
            assert "NOT_FOUND" in (check("missing.x") or "")
            now[0] += 0.01
        assert check.asked == 2
        now[0] += 1.0  # the relay was idle: a replay after the fix is asked about afresh
        conn.default_channel.exchange_declare("missing.x", "direct", durable=True, auto_delete=False)
        assert check("missing.x") is None and check.asked == 3
        check.learn("ok.x", "cannot publish to internal exchange", ttl=60)
        now[0] += 30  # learned with a ttl: held, idle or not
        assert check("ok.x") == "cannot publish to internal exchange" and check.asked == 3
        broker.set_permissions(write=r"^(?!ok\.x$).*$")
        now[0] += 31
        assert "ACCESS_REFUSED" in (check("ok.x") or ""), "the write probe finds what the user may not write"
        check.close()
    broker.close()
