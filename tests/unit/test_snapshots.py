"""Snapshots of the live cancellations (pure): parts and seals, the newest complete one, when to write one."""

from __future__ import annotations

import random

import pytest

from kombu_ladder.cancellation.records import LiveSet, Record
from kombu_ladder.controlplane import MARKER, SEAL, SNAPSHOT
from kombu_ladder.controlplane.codec import ForgedRecord, Part, RecordError, Seal, decode, encode
from kombu_ladder.controlplane.snapshots import (
    EVERY_MS,
    MAX_EVERY_MS,
    MAX_JITTER,
    MIN_SPACING_MS,
    SIZE_UNIT,
    Chooser,
    Policy,
    Snapshot,
    windows_ms,
)
from kombu_ladder.controlplane.snapshots import encode as encode_snapshot

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000


def _entries(count: int) -> list[tuple[str, int, int]]:
    return [(f"id-{i}", NOW - i, NOW + 3_600_000 + i) for i in range(count)]


def _records(snapshot: str, count: int, *, covers: int, at: int = NOW, part_entries: int = 3) -> list[Part | Seal]:
    parts, seal = encode_snapshot(snapshot, _entries(count), covers=covers, at=at, part_entries=part_entries)
    return [*(decode(body, SNAPSHOT.exchange) for body in parts), seal]  # type: ignore[misc]


def test_a_snapshot_is_written_in_parts_and_read_back_whole() -> None:
    parts, seal = encode_snapshot("s1", _entries(7), covers=41, at=NOW, part_entries=3)
    assert len(parts) == 3 and seal == Seal("s1", 3, 41, NOW)
    decoded = [decode(body, SNAPSHOT.exchange) for body in parts]
    assert [p.index for p in decoded] == [0, 1, 2]  # type: ignore[union-attr]
    assert [len(p.entries) for p in decoded] == [3, 3, 1]  # type: ignore[union-attr]
    assert decode(encode(seal), SEAL.exchange) == seal
    chooser = Chooser()
    for record in decoded:
        assert chooser.add(record) is None  # type: ignore[arg-type]
    done = chooser.add(seal)
    assert done is not None and list(done.entries) == _entries(7)


def test_an_empty_live_set_is_one_empty_part() -> None:
    parts, seal = encode_snapshot("s0", [], covers=0, at=NOW)
    assert len(parts) == 1 and seal.parts == 1
    chooser = Chooser()
    chooser.add(decode(parts[0], SNAPSHOT.exchange))  # type: ignore[arg-type]
    assert chooser.add(seal) == Snapshot(seal, ())


@pytest.mark.parametrize("damage", ["no seal", "a part missing", "a count too high", "a count too low"])
def test_an_incomplete_snapshot_is_ignored_and_the_previous_one_stays_newest(damage: str) -> None:
    chooser = Chooser()
    for record in _records("old", 4, covers=10):
        chooser.add(record)
    assert chooser.newest is not None and chooser.newest.seal.snapshot == "old"
    records = _records("new", 7, covers=99, at=NOW + 1)
    seal = records.pop()
    assert isinstance(seal, Seal)
    if damage == "a part missing":
        records.pop(1)
    elif damage == "a count too high":
        seal = Seal(seal.snapshot, seal.parts + 1, seal.covers, seal.at)
    elif damage == "a count too low":
        seal = Seal(seal.snapshot, seal.parts - 1, seal.covers, seal.at)
    for record in records:
        chooser.add(record)
    if damage != "no seal":
        assert chooser.add(seal) is None
        assert chooser.incomplete == 1
    assert chooser.newest.seal.snapshot == "old"


def test_the_newest_is_the_one_covering_the_highest_offset_whatever_the_order_read() -> None:
    chooser = Chooser()
    for record in _records("later", 2, covers=500):
        chooser.add(record)
    for record in _records("earlier", 5, covers=100, at=NOW + 10):
        chooser.add(record)  # written later (two relays), covering less: not newer
    assert chooser.newest is not None and chooser.newest.seal.snapshot == "later"


def test_interleaved_snapshots_of_two_writers_are_each_complete() -> None:
    chooser = Chooser()
    a, b = _records("a", 6, covers=10), _records("b", 6, covers=20)
    for left, right in zip(a, b):
        chooser.add(left)
        chooser.add(right)
    assert chooser.newest is not None and chooser.newest.seal.snapshot == "b"
    assert chooser.incomplete == 0


def test_a_part_read_twice_keeps_its_first_copy() -> None:
    chooser = Chooser()
    records = _records("s", 3, covers=5, part_entries=3)
    forged = Part("s", 0, (("other", NOW, NOW + 1),))
    chooser.add(records[0])
    chooser.add(forged)
    done = chooser.add(records[1])
    assert done is not None and [e[0] for e in done.entries] == ["id-0", "id-1", "id-2"]


def test_unsealed_snapshots_are_forgotten_oldest_first_past_keep() -> None:
    chooser = Chooser(keep=2)
    for name in ("x", "y", "z"):
        chooser.add(Part(name, 0, ()))
    assert chooser.add(Seal("x", 1, 1, NOW)) is None  # its part was forgotten: incomplete
    assert chooser.add(Seal("z", 1, 2, NOW)) is not None


@pytest.mark.parametrize("body", [
    b'{"ladder":"snapshot","v":1,"id":"s","part":-1,"entries":[]}',
    b'{"ladder":"snapshot","v":1,"id":"s","part":0,"entries":[["a",1]]}',
    b'{"ladder":"snapshot","v":1,"id":"s","part":0,"entries":[["",1,2]]}',
    b'{"ladder":"snapshot","v":1,"id":"s","part":0,"entries":[["a",1,-2]]}',
    b'{"ladder":"snapshot","v":1,"id":"s","part":0,"entries":{}}',
    b'{"ladder":"snapshot","v":1,"id":"","part":0,"entries":[]}',
    b'{"ladder":"seal","v":1,"id":"s","parts":0,"covers":1,"at":1}',
    b'{"ladder":"seal","v":1,"id":"s","parts":1,"covers":-1,"at":1}',
    b'{"ladder":"seal","v":1,"id":"s","parts":true,"covers":1,"at":1}',
    b'{"ladder":"seal","v":2,"id":"s","parts":1,"covers":1,"at":1}',
    b'{"ladder":"snapshot","v":1,"id":"s","part":0,"entries":[' + b",".join([b'["a",1,2]'] * 1001) + b"]}",
])
def test_a_malformed_part_or_seal_is_refused(body: bytes) -> None:
    exchange = SEAL.exchange if b'"seal"' in body else SNAPSHOT.exchange
    with pytest.raises(RecordError):
        decode(body, exchange)


@pytest.mark.parametrize("exchange", ["", MARKER.exchange, "ladder.record.cancel", SEAL.exchange])
def test_a_part_is_read_only_from_its_own_exchange(exchange: str) -> None:
    body = encode(Part("s", 0, (("a", 1, 2),)))
    with pytest.raises(ForgedRecord):
        decode(body, exchange)


@pytest.mark.parametrize("exchange", ["", MARKER.exchange, SNAPSHOT.exchange])
def test_a_seal_is_read_only_from_its_own_exchange(exchange: str) -> None:
    with pytest.raises(ForgedRecord):
        decode(encode(Seal("s", 1, 2, 3)), exchange)


def test_a_live_set_restored_from_its_entries_cancels_as_the_original() -> None:
    original = LiveSet()
    original.add(Record("cancel", "gone", NOW - 1000), NOW)
    original.add(Record("cancel", "due", NOW - 1000, due=NOW + 60_000), NOW)
    copy = LiveSet()
    assert copy.restore(original.entries(), NOW) == 2
    for later in (NOW, NOW + 60_000 + copy.margin_ms - 1, NOW + 60_000 + copy.margin_ms):
        for key in ("gone", "due"):
            for entered in (None, NOW - 1000 + copy.slack_ms, NOW - 1000 + copy.slack_ms + 1):
                assert copy.cancelled(key, later, entered=entered) == original.cancelled(key, later, entered=entered)
    assert LiveSet().restore([("old", NOW - 10, NOW)], NOW) == 0  # expired: not kept


def test_the_policy_writes_by_count_and_by_time_never_closer_than_its_spacing() -> None:
    policy = Policy(every_records=100, every_ms=60_000, min_spacing_ms=5_000, jitter=0.0)
    assert policy.due(records=None, since_ms=None)  # none known: write one
    assert not policy.due(records=10_000, since_ms=4_999)  # a burst: spacing first
    assert policy.due(records=100, since_ms=5_000)
    assert not policy.due(records=99, since_ms=59_999)
    assert policy.due(records=0, since_ms=60_000)  # by time, records or none


def test_the_jitter_scales_both_thresholds_within_its_bound() -> None:
    policy = Policy(every_records=100, every_ms=60_000, min_spacing_ms=0, jitter=MAX_JITTER)
    assert not policy.due(records=124, since_ms=74_999)
    assert policy.due(records=125, since_ms=0)
    assert policy.due(records=0, since_ms=75_000)
    drawn = {Policy(rng=random.Random(seed)).jitter for seed in range(20)}
    assert len(drawn) == 20 and all(0 <= j <= MAX_JITTER for j in drawn)


def test_the_windows_reach_past_the_longest_time_between_two_snapshots() -> None:
    short, long = windows_ms(EVERY_MS)
    assert short > EVERY_MS * (1 + MAX_JITTER) and long > MAX_EVERY_MS * (1 + MAX_JITTER)
    policy = Policy(jitter=MAX_JITTER)
    for live in (0, SIZE_UNIT, 3 * SIZE_UNIT, 1000 * SIZE_UNIT):  # by time alone, a snapshot is in the window
        window = short if live <= SIZE_UNIT else long
        assert policy.due(records=0, since_ms=window - 45_000, live=live)


def test_the_times_grow_with_the_live_set_up_to_a_bound() -> None:
    policy = Policy(every_records=100, jitter=0.0)
    assert not policy.due(records=10 ** 6, since_ms=2 * MIN_SPACING_MS - 1, live=2 * SIZE_UNIT)  # spacing x2
    assert policy.due(records=10 ** 6, since_ms=2 * MIN_SPACING_MS, live=2 * SIZE_UNIT)
    assert not policy.due(records=0, since_ms=3 * EVERY_MS - 1, live=3 * SIZE_UNIT)
    assert policy.due(records=0, since_ms=3 * EVERY_MS, live=3 * SIZE_UNIT)
    assert policy.due(records=0, since_ms=MAX_EVERY_MS, live=10 ** 7)  # however big


@pytest.mark.parametrize("variable,value,message", [
    ("LADDER_SNAPSHOT_RECORDS", "ten", "LADDER_SNAPSHOT_RECORDS must be an integer"),
    ("LADDER_SNAPSHOT_RECORDS", "0", "every_records must be an integer of at least 1"),
    ("LADDER_SNAPSHOT_SECONDS", "-5", "LADDER_SNAPSHOT_SECONDS must be from 0"),
    ("LADDER_SNAPSHOT_PART_ENTRIES", "99999999999", "LADDER_SNAPSHOT_PART_ENTRIES must be from 0"),
])
def test_the_policy_from_the_environment_names_a_bad_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Policy.from_env({variable: value})


def test_the_policy_from_the_environment() -> None:
    policy = Policy.from_env({"LADDER_SNAPSHOT_RECORDS": "20", "LADDER_SNAPSHOT_SECONDS": "3",
                              "LADDER_SNAPSHOT_SPACING_SECONDS": "0", "LADDER_SNAPSHOT_PART_ENTRIES": "5"})
    assert (policy.every_records, policy.every_ms, policy.min_spacing_ms, policy.part_entries) == (20, 3000, 0, 5)
