"""The index's pure parts: the record codec, the queries, and SQLite answers at 100,000 entries."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from kombu_ladder.cancellation.records import SLACK
from kombu_ladder.controlplane import ENTRY, codec
from kombu_ladder.index import Filter, IndexStore, parse_when
from kombu_ladder.index.query import group_sql, hour_label
from kombu_ladder.index.records import (
    MAX_ENTRIES,
    MAX_RECORD_BYTES,
    Entry,
    IndexRecordError,
    encode_batch,
    entry,
)
from kombu_ladder.index.writer import IndexWriter

pytestmark = pytest.mark.unit

NOW = 1_796_000_000_000


def decode(body: Any) -> Any:
    """A record read from ``ladder.index``, as delivered through the index's exchange."""
    return codec.decode(body, ENTRY.exchange)


def _entry(i: int, **given: Any) -> Entry:
    values: dict[str, Any] = {"message_id": f"m-{i}", "task_id": f"t-{i}", "task": "billing.send_invoice",
                              "exchange": "billing", "routing_key": "invoice.due", "due": NOW + 1000 + i, "at": NOW,
                              "size": 600}
    values.update(given)
    return Entry(**values)


def test_a_batch_comes_back_as_it_was_written() -> None:
    entries = [_entry(1), _entry(2, message_id=None, task_id=None, task=None, exchange=""), _entry(3, task="é✓")]
    assert decode(encode_batch(entries)) == codec.Entries(tuple(entries))


@pytest.mark.parametrize("given,reason", [
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"[1]", "not a JSON object"),
    (b'{"ladder":"cancel","v":1}', "through the exchange"),
    (b'{"ladder":"index","v":true,"n":[]}', "field 'v'"),
    (b'{"ladder":"index","v":1,"n":[]}', "field 'n'"),
    (b'{"ladder":"index","v":1,"n":{}}', "field 'n'"),
    (b'{"ladder":"index","v":1,"n":[7]}', "entry 0 is not a JSON object"),
    (b'{"ladder":"index","v":1,"n":[{"e":"","r":"q","d":"1","a":0}]}', "'n[0].d'"),
    (b'{"ladder":"index","v":1,"n":[{"e":"","r":"q","d":1,"a":-5}]}', "'n[0].a'"),
    (b'{"ladder":"index","v":1,"n":[{"e":1,"r":"q","d":1,"a":0}]}', "'n[0].e'"),
    (b'{"ladder":"index","v":1,"n":[{"r":"q","d":1,"a":0}]}', "'n[0].e'"),
    (b'{"ladder":"index","v":1,"n":[{"e":"","r":"q","d":1,"a":0,"s":true}]}', "'n[0].s'"),
    (json.dumps({"ladder": "index", "v": 1, "n": [{"e": "", "r": "q", "d": 1, "a": 0, "m": "x" * 256}]}).encode(),
     "'n[0].m'"),
    (b'{"ladder":"marker","v":1}', "through the exchange"),
    (b" " * (MAX_RECORD_BYTES + 1), "more than"),
    (b"[" * 100_000, "not UTF-8 JSON"),
])
def test_a_record_that_is_not_ours_is_refused_with_the_reason(given: bytes, reason: str) -> None:
    with pytest.raises(IndexRecordError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        decode(given)


def test_a_batch_is_one_to_max_entries() -> None:
    with pytest.raises(ValueError):
        encode_batch([])
    with pytest.raises(ValueError):
        encode_batch([_entry(0)] * (MAX_ENTRIES + 1))
    assert len(encode_batch([_entry(i) for i in range(MAX_ENTRIES)])) < MAX_RECORD_BYTES


def test_entry_leaves_out_ids_that_cannot_be_ids() -> None:
    made = entry(message_id=b"bytes-id", task_id=7, task="", exchange="", routing_key="q", due=1, at=0, size=-1)
    assert (made.message_id, made.task_id, made.task, made.size) == ("bytes-id", None, None, 0)


@pytest.mark.parametrize("given,expected", [
    ("+2h", NOW + 2 * 3600_000), ("30m", NOW + 1800_000), ("-1d", NOW - 86400_000), ("1.5s", NOW + 1500),
    ("3600", NOW + 3600_000), ("-90", NOW - 90_000),
    ("2026-12-02T03:00", 1796180400000), ("2026-12-02T03:00Z", 1796180400000),
    ("2026-12-02T04:00+01:00", 1796180400000),
])
def test_times_are_iso_or_relative(given: str, expected: int) -> None:
    assert parse_when(given, option="--due-before", now_ms=NOW) == expected


@pytest.mark.parametrize("given", ["tomorrow", "2h30", "", "+h", "2026-13-01"])
def test_a_bad_time_names_the_option(given: str) -> None:
    with pytest.raises(ValueError, match="^--due-after: "):
        parse_when(given, option="--due-after", now_ms=NOW)


def test_an_unknown_grouping_names_by() -> None:
    with pytest.raises(ValueError, match="^--by: 'queue' is not one of due-hour, target, task"):
        group_sql("queue")
    assert hour_label(1796180400000 + 59 * 60_000) == "2026-12-02T03:59Z"


def test_a_cancellation_applies_to_what_was_waiting_when_it_was_written() -> None:
    store = IndexStore(":memory:")
    store.add([_entry(1, at=NOW), _entry(2, at=NOW + SLACK + 10_000), _entry(3)])
    store.cancel("t-1", NOW + 5)  # by task id, after the first was published
    store.cancel("m-2", NOW)  # by message id, written long before the second was published: not its business
    assert [store.find(f"m-{i}", NOW)[0].state for i in (1, 2, 3)] == ["cancelled", "waiting", "waiting"]
    assert [r.entry.message_id for r in store.listing(Filter(), NOW)] == ["m-2", "m-3"]
    assert store.count(Filter(everything=True), NOW) == [((), 3)]


def test_list_pages_and_filters() -> None:
    store = IndexStore(":memory:")
    store.add([_entry(i, task="a" if i % 3 else "b", routing_key=f"k{i % 2}") for i in range(30)])
    page = store.listing(Filter(task="a"), NOW, limit=5, offset=5)
    assert [r.entry.message_id for r in page] == [f"m-{i}" for i in (8, 10, 11, 13, 14)]
    assert [r.entry.due for r in store.listing(Filter(due_after=NOW + 1010, due_before=NOW + 1013), NOW)] == \
        [NOW + 1010, NOW + 1011, NOW + 1012]
    assert dict(store.count(Filter(), NOW, by="target")) == {("billing", "k0"): 15, ("billing", "k1"): 15}
    assert store.count(Filter(routing_key="k1", task="b"), NOW) == [((), 5)]
    assert store.count(Filter(), NOW + 1020, by="due-hour") == [(((NOW + 1020) // 3600_000 * 3600_000,), 9)]


def test_prune_forgets_what_fell_due_a_day_ago() -> None:
    store = IndexStore(":memory:")
    store.add([_entry(0, due=NOW - 2 * 86400_000), _entry(1, due=NOW - 1000)])
    assert store.prune(NOW) == 1 and len(store) == 1


def test_at_100k_entries_find_list_and_a_grouped_count_answer_within_bounds(tmp_path: Any) -> None:
    """The issue's bound is 100 ms for a find at a million; here 100k, on a shared two-core machine."""
    store = IndexStore(str(tmp_path / "i.sqlite"))
    with store.transaction():
        store.add(_entry(i, task=f"task.{i % 50}", routing_key=f"key.{i % 20}", due=NOW + i * 1000)
                  for i in range(100_000))
        for i in range(0, 100_000, 100):
            store.cancel(f"t-{i}", NOW)
    started = time.perf_counter()
    for i in range(0, 100_000, 1000):
        assert store.find(f"t-{i + 7}", NOW)[0].entry.message_id == f"m-{i + 7}"
    find_each = (time.perf_counter() - started) / 100
    started = time.perf_counter()
    page = store.listing(Filter(task="task.7", due_after=NOW + 50_000_000), NOW, limit=50, offset=100)
    list_page = time.perf_counter() - started
    assert len(page) == 50
    assert find_each < 0.1 and list_page < 0.1, (find_each, list_page)
    assert sum(n for _, n in store.count(Filter(), NOW, by="task")) == 99_000


def test_a_writer_sends_each_entry_in_a_record_of_its_own_declared_once_first() -> None:
    sent: list[bytes] = []
    declared: list[bool] = []
    writer = IndexWriter()
    for i in range(3):
        assert writer.write(_entry(i), sent.append, lambda: declared.append(True)) is True
    assert [len(decode(b).entries) for b in sent] == [1, 1, 1] and declared == [True]
    assert (writer.sent, writer.lost) == (3, 0)


def test_a_writer_that_cannot_send_raises_so_that_the_message_is_not_published() -> None:
    writer = IndexWriter()

    def refuse(record: bytes) -> None:
        raise OSError("gone")

    with pytest.raises(OSError, match="gone"):
        writer.write(_entry(0), refuse)
    assert (writer.sent, writer.refused) == (0, None)


def test_a_writer_refused_the_stream_logs_once_sends_nothing_more_and_raises_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    from kombu_ladder.index.writer import IndexRefused

    sent: list[bytes] = []
    checks: list[bool] = []

    def refused() -> None:
        checks.append(True)
        raise IndexRefused("this user may not append to the stream ladder.index")

    writer = IndexWriter()
    with caplog.at_level("WARNING", logger="kombu_ladder.index"):
        written = [writer.write(_entry(i), sent.append, refused) for i in range(5)]
    assert written == [False] * 5
    assert sent == [] and checks == [True] and (writer.sent, writer.lost) == (0, 5)
    assert writer.refused is not None and "may not append" in writer.refused
    assert [r.getMessage()[:10] for r in caplog.records if r.name == "kombu_ladder.index"] == ["unindexed:"]


def test_a_cancellation_read_before_its_entry_still_applies_to_it() -> None:
    """A producer's last entries may reach the stream after a cancellation of them (sent with its next publish)."""
    store = IndexStore(":memory:")
    store.cancel("t-1", NOW + 5)
    store.add([_entry(1, at=NOW), _entry(2, at=NOW)])
    assert [store.find(f"m-{i}", NOW)[0].state for i in (1, 2)] == ["cancelled", "waiting"]
    reopened_state = store.count(Filter(), NOW)
    assert reopened_state == [((), 1)]


def _indexes(store: IndexStore) -> set[str]:
    return {row[0] for row in store._db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'entries' AND sql IS NOT NULL")}


def test_a_bulk_load_builds_the_indexes_again_even_when_it_fails(tmp_path: Any) -> None:
    store = IndexStore(str(tmp_path / "i.sqlite"))
    built = _indexes(store)
    assert len(built) == 5
    with pytest.raises(RuntimeError):
        with store.loading():
            assert _indexes(store) == set()
            store.add([_entry(1)])
            raise RuntimeError("the broker went away")
    assert _indexes(store) == built and store.find("t-1", NOW)[0].state == "waiting"
    plan = " ".join(str(row) for row in store._db.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM entries WHERE task_id = 't-1'"))
    assert "entries_task_id" in plan
