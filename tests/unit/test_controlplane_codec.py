"""The control plane's one codec: every kind round-trips, limits hold, and what is refused says why (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kombu_ladder.controlplane import ADOPTED, CANCEL, ENTRY, KINDS, MARKER
from kombu_ladder.controlplane.codec import (
    FORMATS,
    MAX_BYTES,
    MAX_CANCEL_BYTES,
    MAX_CANCEL_IDS,
    Adoption,
    Cancel,
    Cancellation,
    Entries,
    Entry,
    ForgedRecord,
    Marker,
    RecordError,
    UnknownRecord,
    decode,
    encode,
    kind_of,
    pack_ids,
)

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000
ENTRY_1 = Entry("m-1", "t-1", "billing.send", "billing", "invoice", NOW + 1000, NOW, 600)


@pytest.mark.parametrize("record,exchange", [
    (Cancel(("m-1",), NOW), CANCEL.exchange),
    (Cancel(("m-1",), NOW, NOW + 5000, "task_id"), CANCEL.exchange),
    (Cancel(tuple(f"id-{i}" for i in range(MAX_CANCEL_IDS)), NOW), CANCEL.exchange),
    (Cancel(("é✓",) * 3, NOW), CANCEL.exchange),
    (Entries((ENTRY_1, ENTRY_1._replace(message_id=None, was=NOW))), ENTRY.exchange),
    (Adoption("task-1", "2027-01-15T10:00:00+00:00", NOW), ADOPTED.exchange),
    (Marker("token", NOW), MARKER.exchange),
])
def test_every_kind_comes_back_as_written_from_its_own_exchange_only(record: Any, exchange: str) -> None:
    body = encode(record)
    assert decode(body, exchange) == record
    assert decode(body.decode("utf-8"), exchange) == record  # py-amqp hands a str to a reader of a utf-8 body
    for other in ["", "amq.direct", *(k.exchange for k in KINDS if k.exchange != exchange)]:
        with pytest.raises(ForgedRecord, match="through the exchange") as refused:
            decode(body, other)
        assert refused.value.reason == "exchange" and refused.value.kind == kind_of(record)


def test_the_table_has_a_format_for_every_kind_of_the_declaration_table() -> None:
    assert sorted(FORMATS) == sorted(k.name for k in KINDS)


def test_a_single_id_record_is_written_as_before_and_a_batch_as_ids() -> None:
    assert json.loads(encode(Cancel(("m-1",), NOW))) == {"ladder": "cancel", "v": 1, "id": "m-1", "at": NOW}
    assert json.loads(encode(Cancel(("a", "b"), NOW)))["ids"] == ["a", "b"]
    assert decode(b'{"ladder":"cancel","v":1,"id":"m-1","at":5}', CANCEL.exchange).each() == (
        Cancellation("cancel", "m-1", 5),)


def test_ids_are_packed_into_records_within_both_limits() -> None:
    assert pack_ids([], at=NOW) == []
    small = pack_ids([f"{i:036d}" for i in range(2500)], at=NOW)
    assert [len(r.ids) for r in small] == [MAX_CANCEL_IDS, MAX_CANCEL_IDS, 500]
    escaped = pack_ids(["\x01" * 255] * 300, at=NOW, due=NOW + 1, key="task_id")  # 6 bytes a character in JSON
    assert len(escaped) > 1 and sum(len(r.ids) for r in escaped) == 300
    for record in small + escaped:
        assert len(encode(record)) <= MAX_CANCEL_BYTES
        assert decode(encode(record), CANCEL.exchange) == record


@pytest.mark.parametrize("body,exchange,reason,match", [
    (b"\xff\xfe", CANCEL.exchange, "malformed", "not UTF-8 JSON"),
    (b"[1]", CANCEL.exchange, "malformed", "not a JSON object"),
    (b" " * (MAX_BYTES + 1), CANCEL.exchange, "size", "more than"),
    (json.dumps({"ladder": "cancel", "v": 1, "ids": ["x" * 200] * 400, "at": 1}).encode(), CANCEL.exchange, "size",
     f"more than {MAX_CANCEL_BYTES}"),
    (json.dumps({"ladder": "adopted", "v": 1, "id": "x", "eta": "e" * 250, "due": 1, "pad": "p" * 4000}).encode(),
     ADOPTED.exchange, "size", "more than 4096"),
    (b'{"ladder":"snapshot-part","v":1}', CANCEL.exchange, "unknown", "field 'ladder'"),
    (b'{"ladder":7,"v":1}', CANCEL.exchange, "unknown", "field 'ladder'"),
    (b'{"v":1}', CANCEL.exchange, "unknown", "field 'ladder'"),
    (b'{"ladder":"cancel","v":2,"id":"x","at":1}', CANCEL.exchange, "unknown", "field 'v'"),
    (b'{"ladder":"cancel","v":true,"id":"x","at":1}', CANCEL.exchange, "unknown", "field 'v'"),
    (b'{"ladder":"index","v":9,"n":[]}', ENTRY.exchange, "unknown", "field 'v'"),
    (b'{"ladder":"cancel","v":1,"ids":[],"at":1}', CANCEL.exchange, "malformed", "field 'ids'"),
    (json.dumps({"ladder": "cancel", "v": 1, "ids": ["x"] * (MAX_CANCEL_IDS + 1), "at": 1}).encode(),
     CANCEL.exchange, "malformed", "field 'ids'"),
    (b'{"ladder":"cancel","v":1,"ids":["a",7],"at":1}', CANCEL.exchange, "malformed", r"field 'ids\[1\]'"),
    (b'{"ladder":"cancel","v":1,"id":"x","at":1,"key":"body"}', CANCEL.exchange, "malformed", "field 'key'"),
    (b'{"ladder":"cancel","v":1,"id":"x","at":-1}', CANCEL.exchange, "malformed", "field 'at'"),
    (b'{"ladder":"marker","v":1}', MARKER.exchange, "malformed", "field 'id'"),
    (b'{"ladder":"adopted","v":1,"id":"x","eta":"","due":1}', ADOPTED.exchange, "malformed", "field 'eta'"),
    (b'{"ladder":"index","v":1,"n":[{"e":"","r":"q","d":"1","a":0}]}', ENTRY.exchange, "malformed",
     r"'n\[0\]\.d'"),
])
def test_a_refused_record_says_why_and_under_which_reason(body: bytes, exchange: str, reason: str,
                                                           match: str) -> None:
    with pytest.raises(RecordError, match=match) as refused:
        decode(body, exchange)
    assert refused.value.reason == reason
    assert isinstance(refused.value, UnknownRecord) is (reason == "unknown")


def test_encode_refuses_what_no_record_can_hold() -> None:
    with pytest.raises(ValueError, match="1 to 1000 ids"):
        encode(Cancel((), NOW))
    with pytest.raises(ValueError, match="message_id"):
        encode(Cancel(("",), NOW))
    with pytest.raises(ValueError, match="key must be one of"):
        encode(Cancel(("x",), NOW, key="body"))
    with pytest.raises(ValueError, match="1 to 1000 entries"):
        encode(Entries(()))
    with pytest.raises(ValueError, match="field 'due'"):
        encode(Adoption("x", "eta", -1))
    with pytest.raises(TypeError, match="not a control-plane record"):
        encode("a str")  # type: ignore[arg-type]
