"""The cancellation record format and the live set (pure)."""

from __future__ import annotations

import json

import pytest

from kombu_ladder.cancellation import records
from kombu_ladder.cancellation.records import LiveSet, Record, RecordError, encode
from kombu_ladder.controlplane import CANCEL, MARKER, codec
from kombu_ladder.controlplane.codec import Marker

NOW = 1_800_000_000_000


def decode(body: object) -> Record:
    """The one cancellation a single-id record read from ``ladder.cancellations`` holds."""
    [record] = codec.decode(body, CANCEL.exchange).each()  # type: ignore[union-attr]
    return record


def test_a_record_round_trips_with_and_without_its_due_time() -> None:
    assert decode(encode("m-1", at=NOW, due=NOW + 5000)) == Record("cancel", "m-1", NOW, NOW + 5000)
    assert decode(encode("m-1", at=NOW)) == Record("cancel", "m-1", NOW, None)
    assert codec.decode(codec.encode(Marker("tok", NOW)), MARKER.exchange) == Marker("tok", NOW)


@pytest.mark.parametrize("given,why", [
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"{", "not UTF-8 JSON"),
    (b"[" * 2_000_000, "more than"),
    (b"[" * 4000, "not UTF-8 JSON"),
    (json.dumps({"ladder": "purge", "v": 1, "id": "x", "at": 1}).encode(), "field 'ladder'"),
    (json.dumps({"ladder": "cancel", "v": 2, "id": "x", "at": 1}).encode(), "field 'v'"),
    (json.dumps({"ladder": "cancel", "v": True, "id": "x", "at": 1}).encode(), "field 'v'"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": 7, "at": 1}).encode(), "field 'id' must be a str"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": "", "at": 1}).encode(), "must not be empty"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": "é" * 128, "at": 1}).encode(), "longer than 255"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": "x", "at": "1"}).encode(), "field 'at'"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": "x", "at": -1}).encode(), "field 'at'"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": "x", "at": 1, "due": 1.5}).encode(), "field 'due'"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": "x", "at": 1, "due": True}).encode(), "field 'due'"),
    (json.dumps({"ladder": "cancel", "v": 1, "id": "x", "at": 2 ** 60}).encode(), "field 'at'"),
    (42, "not bytes"),
])
def test_a_bad_record_is_refused_with_its_reason(given: object, why: str) -> None:
    with pytest.raises(RecordError, match=why):
        decode(given)


def test_unknown_fields_are_ignored_for_later_versions_of_the_writer() -> None:
    body = json.dumps({"ladder": "cancel", "v": 1, "id": "x", "at": 1, "by": "ops"}).encode()
    assert decode(body).id == "x"


@pytest.mark.parametrize("given,error", [(None, TypeError), (b"x", TypeError), ("", ValueError),
                                         ("x" * 256, ValueError)])
def test_encode_refuses_what_cannot_be_a_message_id(given: object, error: type) -> None:
    with pytest.raises(error, match="message_id"):
        encode(given, at=NOW)  # type: ignore[arg-type]


def test_a_cancellation_with_a_due_time_lives_until_due_plus_margin() -> None:
    live = LiveSet(margin_ms=1000)
    assert live.add(Record("cancel", "a", NOW, NOW + 5000), NOW)
    assert live.cancelled("a", NOW + 5999)
    assert not live.cancelled("a", NOW + 6000)
    assert not live.cancelled("b", NOW)
    assert not live.cancelled(None, NOW)
    assert live.prune(NOW + 6000, force=True) == 1 and len(live) == 0


def test_a_cancellation_lives_for_the_longest_rung_plus_slack_and_margin_after_it_was_written() -> None:
    assert records.LIFE == 3600_000 + records.SLACK + records.MARGIN
    live = LiveSet()
    live.add(Record("cancel", "a", NOW, None), NOW)
    live.add(Record("cancel", "far", NOW, NOW + 30 * 86_400_000), NOW)  # a due time a month ahead: no longer
    for key in ("a", "far"):
        assert live.cancelled(key, NOW + records.LIFE - 1) and not live.cancelled(key, NOW + records.LIFE)


def test_a_record_cancels_only_a_message_that_entered_its_rung_before_it_was_written() -> None:
    live = LiveSet(slack_ms=1000)
    live.add(Record("cancel", "reuse-1", NOW, None), NOW)
    assert live.cancelled("reuse-1", NOW + 5000, entered=NOW - 3_600_000)  # waiting then: dropped
    assert live.cancelled("reuse-1", NOW + 5000, entered=NOW + 1000)  # within the slack: still dropped
    assert not live.cancelled("reuse-1", NOW + 5000, entered=NOW + 1001)  # scheduled after it: kept
    assert live.cancelled("reuse-1", NOW + 5000)  # unknown: the id alone decides


def test_an_expired_record_is_not_kept_and_a_later_expiry_and_write_win() -> None:
    live = LiveSet(margin_ms=0, slack_ms=0)
    assert not live.add(Record("cancel", "old", 0, 10), NOW)
    assert "old" not in live
    live.add(Record("cancel", "a", NOW, NOW + 10), NOW)
    live.add(Record("cancel", "a", NOW + 5, NOW + 100), NOW)
    live.add(Record("cancel", "a", NOW, NOW + 50), NOW)
    assert live.cancelled("a", NOW + 99) and not live.cancelled("a", NOW + 100)
    assert live.cancelled("a", NOW + 50, entered=NOW + 5) and not live.cancelled("a", NOW + 50, entered=NOW + 6)


def test_prune_runs_at_most_once_per_interval_unless_forced() -> None:
    live = LiveSet(margin_ms=0, prune_every_ms=1000)
    live.add(Record("cancel", "a", NOW, NOW + 1), NOW)
    assert live.prune(NOW) == 0  # nothing expired yet; the next scan is a second away
    assert live.prune(NOW + 500) == 0 and "a" in live
    assert live.prune(NOW + 1000) == 1 and "a" not in live


def test_the_stream_name_is_outside_the_contracts_namespace() -> None:
    assert not records.STREAM.startswith("acemq.")
    assert records.STREAM_ARGUMENTS["x-queue-type"] == "stream"


def test_a_task_id_record_says_so_and_a_bad_key_is_refused() -> None:
    assert decode(encode("t-1", at=NOW, key="task_id")) == Record("cancel", "t-1", NOW, None, "task_id")
    assert b"key" not in encode("m-1", at=NOW)  # the default stays implicit
    with pytest.raises(RecordError, match="field 'key'"):
        decode(json.dumps({"ladder": "cancel", "v": 1, "id": "x", "at": 1, "key": "body"}).encode())
    with pytest.raises(ValueError, match="key must be one of"):
        encode("x", at=NOW, key="body")
