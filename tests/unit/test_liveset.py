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


def test_ids_that_share_a_hash_are_told_apart_by_their_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(liveset, "_hash", lambda ident: 42)
    live = LiveSet()
    ids = [f"same-{i}" for i in range(MERGE_AT + 1)]  # one merge, and one pending
    for i, ident in enumerate(ids):
        live.add(Record("cancel", ident, NOW + i, None), NOW)
    assert len(live._pending) == 1 and len(live._hashes) == MERGE_AT  # merged, all with the one hash
    assert all(live.cancelled(ident, NOW, entered=NOW + i + live.slack_ms) for i, ident in enumerate(ids))
    assert not any(live.cancelled(ident, NOW, entered=NOW + i + live.slack_ms + 1) for i, ident in enumerate(ids))
    assert "other" not in live and not live.cancelled("other", NOW)


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
    ids = [f"m-{i}" for i in range(3000)]
    now = NOW
    for step in range(20_000):
        now += rng.randrange(2)
        ident = rng.choice(ids)
        action = rng.random()
        if action < 0.5:
            due = rng.choice([None, now + rng.randrange(-100, 300)])
            record = Record("cancel", ident, now - rng.randrange(500), due)
            assert live.add(record, now) == model.add(record, now)
        elif action < 0.98:
            entered = rng.choice([None, now - rng.randrange(600)])
            assert live.cancelled(ident, now, entered=entered) == model.cancelled(ident, now, entered), step
        else:
            assert live.prune(now, force=True) == model.prune(now)
            assert len(live) == len(model.records)
    assert sorted(i for i in ids if i in live) == sorted(model.records)
