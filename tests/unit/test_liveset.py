"""LiveSet's compact arrays answer as the plain dict of id -> (latest write, latest expiry) they replaced."""

from __future__ import annotations

import random
from typing import Optional

import pytest

from kombu_ladder.cancellation import liveset
from kombu_ladder.cancellation.liveset import MERGE_AT, LiveSet
from kombu_ladder.cancellation.records import LiveSet as Reexported
from kombu_ladder.cancellation.records import Record

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000


class Model:
    """The rule as the old dict implemented it: what LiveSet must still answer."""

    def __init__(self, live: LiveSet) -> None:
        self.live = live
        self.records: dict[str, tuple[int, int]] = {}

    def add(self, record: Record, now: int) -> bool:
        until = self.live.expiry(record)
        if until <= now:
            return False
        at, old = self.records.get(record.id, (record.at, until))
        self.records[record.id] = (max(at, record.at), max(old, until))
        return True

    def cancelled(self, ident: str, now: int, entered: Optional[int]) -> bool:
        found = self.records.get(ident)
        if found is None or found[1] <= now:
            return False
        return entered is None or entered <= found[0] + self.live.slack_ms

    def restore(self, entries: list[tuple[str, int, int]], now: int) -> int:
        live = [(ident, at, until) for ident, at, until in entries if until > now]
        for ident, at, until in live:
            old_at, old_until = self.records.get(ident, (at, until))
            self.records[ident] = (max(old_at, at), max(old_until, until))
        return len(live)

    def entries(self) -> list[tuple[str, int, int]]:
        return sorted((ident, at, until) for ident, (at, until) in self.records.items())

    def prune(self, now: int) -> int:
        expired = [k for k, (_, until) in self.records.items() if until <= now]
        for key in expired:
            del self.records[key]
        return len(expired)


def test_records_reexports_the_one_class() -> None:
    assert Reexported is LiveSet


def test_ids_merged_into_the_arrays_are_found_with_their_times_and_updated_in_place() -> None:
    live = LiveSet(margin_ms=1000, slack_ms=0)
    n = 3 * MERGE_AT + 7  # several merges, and some ids still pending
    for i in range(n):
        assert live.add(Record("cancel", f"id-{i}", NOW + i, NOW + 10_000 + i), NOW)
    assert len(live) == n and len(live._pending) < MERGE_AT and len(live._hashes) >= 3 * MERGE_AT
    assert all(f"id-{i}" in live for i in range(n)) and "id-x" not in live and 7 not in live
    assert live.cancelled("id-5", NOW + 11_004) and not live.cancelled("id-5", NOW + 11_005)  # due + margin
    assert live.cancelled("id-5", NOW, entered=NOW + 5) and not live.cancelled("id-5", NOW, entered=NOW + 6)
    live.add(Record("cancel", "id-5", NOW + 500, NOW + 20_000), NOW)  # merged already: a later write and expiry win
    assert live.cancelled("id-5", NOW + 20_999) and live.cancelled("id-5", NOW, entered=NOW + 500)
    live.add(Record("cancel", "id-5", NOW, NOW + 1), NOW)  # an older, shorter record changes nothing
    assert live.cancelled("id-5", NOW + 20_999) and len(live) == n


def test_ids_that_share_a_hash_are_told_apart_by_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(liveset, "_hash", lambda ident: 42)
    live = LiveSet()
    ids = [f"same-{i}" for i in range(MERGE_AT + 1)]  # one merge, and one pending
    for i, ident in enumerate(ids):
        live.add(Record("cancel", ident, NOW + i, None), NOW)
    assert len(live._pending) == 1 and len(live._hashes) == MERGE_AT  # merged, all with the one hash
    assert all(live.cancelled(ident, NOW, entered=NOW + i + live.slack_ms) for i, ident in enumerate(ids))
    assert not any(live.cancelled(ident, NOW, entered=NOW + i + live.slack_ms + 1) for i, ident in enumerate(ids))
    assert "other" not in live and not live.cancelled("other", NOW)
    assert sorted(live.entries()) == sorted((ident, NOW + i, NOW + live.life_ms + i) for i, ident in enumerate(ids))


def test_prune_forgets_the_expired_ones_pending_and_merged_and_keeps_the_rest() -> None:
    live = LiveSet(margin_ms=0)
    n = 2 * MERGE_AT - 2  # one merge, and the rest pending
    for i in range(n):  # the even ones expire at NOW + 100, the odd ones an hour later
        live.add(Record("cancel", f"id-{i}", NOW, NOW + (100 if i % 2 == 0 else 3_600_000)), NOW)
    assert live._hashes and live._pending
    assert live.prune(NOW + 100, force=True) == n // 2 and len(live) == n // 2
    assert not live._pending and len(live._hashes) == n // 2  # what was pending is merged by the prune
    assert all((f"id-{i}" in live) == (i % 2 == 1) for i in range(n))
    assert live.prune(NOW + 200, force=True) == 0 and len(live) == n // 2


def test_random_operations_answer_as_the_dict_did() -> None:
    rng = random.Random(5)
    live = LiveSet(margin_ms=50, slack_ms=3, life_ms=400)
    model = Model(live)
    # ids of one, two, three and four UTF-8 bytes a character, and a lone surrogate (check_id lets it through)
    prefixes = ("m", "é", "€", "😀", "\ud800")
    ids = [f"{prefixes[i % 5]}-{i}" for i in range(3000)]
    now = NOW
    for step in range(20_000):
        now += rng.randrange(2)
        ident = rng.choice(ids)
        action = rng.random()
        if action < 0.5:
            due = rng.choice([None, now + rng.randrange(-100, 300)])
            record = Record("cancel", ident, now - rng.randrange(500), due)
            assert live.add(record, now) == model.add(record, now)
        elif action < 0.97:
            entered = rng.choice([None, now - rng.randrange(600)])
            assert live.cancelled(ident, now, entered=entered) == model.cancelled(ident, now, entered), step
        elif action < 0.98:  # a snapshot's entries (random, some expired, some kept already) restored into both
            entries = [(rng.choice(ids), now - rng.randrange(500), now + rng.randrange(-50, 400)) for _ in range(30)]
            assert live.restore(entries, now) == model.restore(entries, now)
        elif action < 0.99:  # a relay started again: a new set restored from the entries of this one
            assert live.prune(now, force=True) == model.prune(now)
            copy = LiveSet(margin_ms=50, slack_ms=3, life_ms=400)
            assert copy.restore(live.entries(), now) == len(model.records)
            live = model.live = copy
        else:
            assert live.prune(now, force=True) == model.prune(now)
            assert len(live) == len(model.records)
            assert sorted(live.entries()) == model.entries(), step
    assert sorted(i for i in ids if i in live) == sorted(model.records)
    assert sorted(live.entries()) == model.entries()
    assert all(type(e) is tuple and type(e[0]) is str and type(e[1]) is int and type(e[2]) is int
               for e in live.entries())


def test_entries_round_trip_merged_and_pending_ids_and_restore_keeps_the_latest() -> None:
    live = LiveSet(margin_ms=0)
    n = MERGE_AT + 3  # merged and pending
    for i in range(n):
        live.add(Record("cancel", f"id-{i}", NOW + i, NOW + 10_000), NOW)
    assert live._hashes and live._pending
    entries = live.entries()
    assert sorted(entries) == sorted((f"id-{i}", NOW + i, NOW + 10_000) for i in range(n))
    assert live.restore(entries, NOW) == n and sorted(live.entries()) == sorted(entries)  # itself: no change
    assert live.restore([("id-1", NOW - 5, NOW + 20_000), ("id-2", NOW + 99, NOW + 1)], NOW) == 2
    found = dict((ident, (at, until)) for ident, at, until in live.entries())
    assert found["id-1"] == (NOW + 1, NOW + 20_000) and found["id-2"] == (NOW + 99, NOW + 10_000)
    assert live.restore([("gone", NOW - 5, NOW)], NOW) == 0 and "gone" not in live


def test_a_prune_that_forgets_most_ids_drops_their_bytes() -> None:
    live = LiveSet(margin_ms=0)
    n = 4 * MERGE_AT
    for i in range(n):  # three in four expire at NOW + 100
        live.add(Record("cancel", f"id-{i:05}", NOW, NOW + (3_600_000 if i % 4 == 0 else 100)), NOW)
    live.prune(NOW, force=True)
    assert len(live._ids) == n * 9  # a length byte and 8 bytes each
    assert live.prune(NOW + 100, force=True) == 3 * n // 4
    assert len(live._ids) == n // 4 * 9 and live._garbage == 0
    assert sorted(live.entries()) == [(f"id-{i:05}", NOW, NOW + 3_600_000) for i in range(0, n, 4)]
    assert all(live.cancelled(f"id-{i:05}", NOW + 200) == (i % 4 == 0) for i in range(n))


def test_an_id_longer_than_an_amqp_message_id_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="at most 255 bytes"):
        LiveSet().add(Record("cancel", "é" * 128, NOW, None), NOW)
