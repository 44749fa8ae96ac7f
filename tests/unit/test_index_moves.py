"""The index after a reschedule or a move: the copy's entry, its record field, and the store keeping the latest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kombu_ladder.cancellation.records import LIFE, SLACK
from kombu_ladder.contract import DUE_AT, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from kombu_ladder.controlplane import ENTRY
from kombu_ladder.controlplane.codec import decode as decode_record
from kombu_ladder.index import Filter, IndexStore
from kombu_ladder.index.records import Entry, encode_batch, entry_of

pytestmark = pytest.mark.unit

NOW = 1_796_000_000_000
HOUR = 3_600_000


def _entry(ident: str = "m-1", *, due: int = NOW + HOUR, at: int = NOW, was: Any = None, **given: Any) -> Entry:
    values: dict[str, Any] = {"message_id": ident, "task_id": f"t-{ident}", "task": "billing.send_invoice",
                              "exchange": "billing", "routing_key": "invoice.due", "due": due, "at": at,
                              "size": 600, "was": was}
    values.update(given)
    return Entry(**values)


def _store(*batches: list[Entry]) -> IndexStore:
    store = IndexStore(":memory:")
    for batch in batches:
        store.add(batch)
    return store


def _dues(store: IndexStore, ident: str, now: int = NOW + 1000) -> list[tuple[int, str]]:
    return [(row.entry.due, row.state) for row in store.find(ident, now)]


def test_a_copys_entry_names_the_due_time_it_replaces_and_comes_back_as_written() -> None:
    moved = _entry(due=NOW + 5000, at=NOW + 10, was=NOW + HOUR)
    record = encode_batch([moved, _entry("m-2")])
    assert json.loads(record)["n"][0]["w"] == NOW + HOUR and "w" not in json.loads(record)["n"][1]
    assert decode(record).entries == (moved, _entry("m-2"))


def test_a_record_written_before_reschedules_existed_still_reads() -> None:
    old = b'{"ladder":"index","v":1,"n":[{"e":"","r":"q","d":5,"a":1,"s":3,"m":"m-1"}]}'
    [found] = decode(old).entries
    assert (found.message_id, found.due, found.was) == ("m-1", 5, None)


def test_a_bad_replaced_time_refuses_the_record() -> None:
    with pytest.raises(ValueError, match=r"'n\[0\]\.w'"):
        decode(b'{"ladder":"index","v":1,"n":[{"e":"","r":"q","d":5,"a":1,"w":"soon"}]}')


def test_the_entry_of_a_waiting_message_is_read_from_its_ladder_headers() -> None:
    headers = {TARGET_EXCHANGE: "", TARGET_ROUTING_KEY: "celery", DUE_AT: str(NOW + HOUR), "task": "mail.send",
               "id": "t-9"}
    found = entry_of({"correlation_id": "t-9", "message_id": "m-9"}, headers, 321, at=NOW)
    assert found == Entry("m-9", "t-9", "mail.send", "", "celery", NOW + HOUR, NOW, 321, None)
    copy = entry_of({"message_id": "m-9"}, {**headers, "id": "t-9"}, 321, at=NOW, due=NOW + 5, was=NOW + HOUR)
    assert copy is not None and (copy.due, copy.was, copy.task_id) == (NOW + 5, NOW + HOUR, "t-9")


@pytest.mark.parametrize("headers", [
    {TARGET_EXCHANGE: "", DUE_AT: NOW},                               # no routing key
    {TARGET_EXCHANGE: 7, TARGET_ROUTING_KEY: "q", DUE_AT: NOW},         # not a name
    {TARGET_EXCHANGE: "", TARGET_ROUTING_KEY: "q" * 256, DUE_AT: NOW},  # too long
    {TARGET_EXCHANGE: "", TARGET_ROUTING_KEY: "q", DUE_AT: "soon"},     # no due time
    {TARGET_EXCHANGE: "", TARGET_ROUTING_KEY: "q", DUE_AT: -1},
])
def test_a_message_that_is_not_a_ladder_message_has_no_entry(headers: dict[str, Any]) -> None:
    assert entry_of({"message_id": "m"}, headers, 1, at=NOW) is None


def test_a_reschedule_replaces_the_old_due_time_in_find_list_and_count() -> None:
    store = _store([_entry(), _entry("m-2")], [_entry(due=NOW + 90_000, at=NOW + 500, was=NOW + HOUR)])
    assert _dues(store, "m-1") == [(NOW + 90_000, "waiting")]
    assert _dues(store, "t-m-1") == [(NOW + 90_000, "waiting")]  # by task id too
    soon = Filter(due_before=NOW + 100_000)
    assert [r.entry.message_id for r in store.listing(soon, NOW + 1000)] == ["m-1"]
    assert store.count(Filter(), NOW + 1000) == [((), 2)] and len(store) == 2
    assert store.find("m-1", NOW)[0].entry.was == NOW + HOUR


def test_run_now_shows_the_message_due() -> None:
    store = _store([_entry()], [_entry(due=NOW + 500, at=NOW + 500, was=NOW + HOUR)])
    assert _dues(store, "m-1") == [(NOW + 500, "due")]
    assert store.count(Filter(), NOW + 1000) == [((), 0)]


def test_an_entry_read_after_the_reschedule_that_replaced_it_is_superseded_all_the_same() -> None:
    # The producer's batch lingered: its entry reaches the stream after the reschedule's.
    store = _store([_entry(due=NOW + 90_000, at=NOW + 500, was=NOW + HOUR)], [_entry(), _entry("m-2")])
    assert _dues(store, "m-1") == [(NOW + 90_000, "waiting")] and len(store) == 2


def test_a_second_reschedule_supersedes_the_first_and_the_same_time_keeps_the_copy() -> None:
    store = _store([_entry()], [_entry(due=NOW + 90_000, at=NOW + 500, was=NOW + HOUR)],
                   [_entry(due=NOW + 90_000, at=NOW + 900, was=NOW + 90_000)])
    assert [(r.entry.due, r.entry.at) for r in store.find("m-1", NOW)] == [(NOW + 90_000, NOW + 900)]


def test_only_the_entry_due_at_the_replaced_time_and_published_before_is_superseded() -> None:
    other_due = _entry(due=NOW + 2 * HOUR)  # the same id waiting twice (a reused id): not the one moved
    resent = _entry(at=NOW + 500 + SLACK + 1)  # the same id and time sent again after the move
    store = _store([_entry(), other_due], [_entry(due=NOW + 90_000, at=NOW + 500, was=NOW + HOUR)], [resent])
    assert sorted(_dues(store, "m-1")) == [(NOW + 90_000, "waiting"), (NOW + HOUR, "waiting"),
                                           (NOW + 2 * HOUR, "waiting")]


def test_a_copy_is_cancelled_by_a_cancellation_its_relay_still_enforces() -> None:
    # A relay matches a copy in the control queue by its id alone, while the record is live.
    store = _store([_entry(), _entry("m-2")])
    store.cancel("m-1", NOW + 100)
    store.cancel("m-2", NOW + 100)
    later = NOW + 100 + SLACK + 10_000  # past the slack: a scheduled message then is not cancelled
    store.add([_entry(due=NOW + 90_000, at=later, was=NOW + HOUR),
               _entry("m-2", due=NOW + 90_000, at=NOW + 100 + LIFE + 1, was=NOW + HOUR)])
    assert _dues(store, "m-1") == [(NOW + 90_000, "cancelled")]
    assert _dues(store, "m-2") == [(NOW + 90_000, "waiting")]  # the record had expired: the copy goes through
    plain = _store([_entry("m-3", at=later)])
    plain.cancel("m-3", NOW + 100)
    assert _dues(plain, "m-3") == [(NOW + HOUR, "waiting")]  # scheduled after the cancel (plus the slack)


def test_a_sync_from_the_start_forgets_the_reschedules_too() -> None:
    from kombu_ladder.index.records import STREAM

    store = _store([_entry(due=NOW + 90_000, at=NOW + 500, was=NOW + HOUR)])
    store.forget(STREAM)
    store.add([_entry()])
    assert _dues(store, "m-1") == [(NOW + HOUR, "waiting")]


def test_prune_forgets_reschedules_of_times_a_day_past() -> None:
    store = _store([_entry(due=NOW + 90_000, at=NOW + 500, was=NOW + HOUR)])
    store.prune(NOW + HOUR + 25 * HOUR)
    store.add([_entry()])  # its reschedule is forgotten, and so is it at the next prune
    assert store.prune(NOW + HOUR + 25 * HOUR) == 1


def test_a_bulk_load_with_reschedules_keeps_the_latest(tmp_path: Any) -> None:
    store = IndexStore(str(tmp_path / "index.sqlite"))
    with store.loading():
        store.add([_entry(f"m-{i}") for i in range(500)])
        store.add([_entry(f"m-{i}", due=NOW + 5000, at=NOW + 500, was=NOW + HOUR) for i in range(0, 500, 5)])
    assert store.count(Filter(due_before=NOW + 6000), NOW + 1000) == [((), 100)]
    assert len(store) == 500
    store.close()


def decode(body: Any) -> Any:
    """A record read from ``ladder.index``, as delivered through the index's exchange."""
    return decode_record(body, ENTRY.exchange)
