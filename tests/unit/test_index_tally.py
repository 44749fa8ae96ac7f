"""The index's counts and histograms, read from its per-minute tally, equal counting every entry; a version 3 file
gains the tally it lacks; connections that open one file at once all open it."""

from __future__ import annotations

import random
import sqlite3
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from kombu_ladder.index import Filter, IndexStore
from kombu_ladder.index.query import MINUTE, TALLIES, WAITING, group_sql, parts, split, where
from kombu_ladder.index.records import Entry

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000 + 12_345  # not on a whole minute
TASKS = (None, "billing.a", "billing.b", "")
TARGETS = (("", "q.1"), ("", "q.2"), ("billing", "q.1"))


def counted(store: IndexStore, found: Filter, now: int, by: Optional[str] = None) -> list[tuple[tuple, int]]:
    """Every entry counted, as the store did before it had a tally."""
    condition, params = where(found, now)
    if by is None:
        return [((), store._db.execute(f"SELECT count(*) FROM entries e WHERE {condition}", params).fetchone()[0])]
    keys = ", ".join(group_sql(by))
    rows = [(tuple(r[:-1]), r[-1]) for r in store._db.execute(
        f"SELECT {keys}, count(*) FROM entries e WHERE {condition} GROUP BY {keys}", params)]
    if by == "due-hour":
        return sorted(rows)
    return sorted(rows, key=lambda item: (-item[1], [(v is not None, v) for v in item[0]]))


def histogrammed(store: IndexStore, start: int, width: int, buckets: int, now: int) -> list[int]:
    counts = [0] * buckets
    for bucket, n in store._db.execute(
            f"SELECT (e.due - :start) / :width, count(*) FROM entries e WHERE {WAITING} AND e.due >= :start "
            "AND e.due < :end GROUP BY 1",
            {"start": start, "width": width, "end": start + width * buckets, "now": now}):
        counts[bucket] = n
    return counts


def entries(rng: random.Random, n: int, prefix: str) -> list[Entry]:
    out = []
    for i in range(n):
        task = rng.choice(TASKS)
        exchange, routing_key = rng.choice(TARGETS)
        due = NOW + rng.randrange(-2 * 3600_000, 9 * 3600_000)
        if rng.random() < 0.1:
            due = due // MINUTE * MINUTE  # on a minute's edge
        out.append(Entry(f"{prefix}{i}", f"t-{prefix}{i}" if task is not None else None, task, exchange, routing_key,
                         due, NOW - rng.randrange(3600_000), 100))
    return out


def filters(rng: random.Random) -> list[Filter]:
    edges = [None, NOW - 600_000, NOW + 1, NOW + 60_000 - 12_345, NOW + 90_000, NOW + 3 * 3600_000 + 7,
             (NOW // 3600_000 + 5) * 3600_000, (NOW // 3600_000 + 7) * 3600_000 + 120_000]
    found = []
    for _ in range(40):
        low, high = rng.choice(edges), rng.choice(edges)
        target = rng.choice((None, *TARGETS))
        found.append(Filter(due_after=low, due_before=high, task=rng.choice((None, *TASKS[1:])),
                            exchange=None if target is None else target[0],
                            routing_key=None if target is None or rng.random() < 0.5 else target[1],
                            everything=rng.random() < 0.3))
    return found


def check(store: IndexStore, rng: random.Random) -> None:
    for now in (NOW, NOW + 45_000, NOW + 3600_000):
        for found in filters(rng):
            for by in (None, "task", "target", "due-hour"):
                assert store.count(found, now, by=by) == counted(store, found, now, by), (found, now, by)
        for start, width, buckets in ((now // MINUTE * MINUTE, MINUTE, 60), (now // 3600_000 * 3600_000, 3600_000, 24),
                                      (now, 1000, 90), (now - 5 * MINUTE, 7 * MINUTE, 30)):
            assert store.histogram(start, width, buckets, now) == histogrammed(store, start, width, buckets, now)


def test_counts_and_histograms_equal_counting_every_entry_through_adds_cancels_moves_and_prunes() -> None:
    rng = random.Random(3)
    store = IndexStore(":memory:")
    batch = entries(rng, 1500, "m")
    store.add(batch)
    check(store, rng)
    for entry in rng.sample(batch, 100):  # cancelled by message id and by task id
        store.cancel(entry.task_id or entry.message_id, NOW)
    moved = [e._replace(due=e.due + 600_000, at=NOW, was=e.due) for e in rng.sample(batch, 100)]
    store.add(moved)  # a reschedule's copies supersede the entries they replace
    check(store, rng)
    with store.loading():  # a bulk load, its secondary indexes dropped: the tally is kept all the same
        store.add(entries(rng, 500, "b"))
    assert store.prune(NOW + 23 * 3600_000, keep_ms=0) > 0
    check(store, rng)
    store.forget("ladder.index")
    assert store.count(Filter(everything=True), NOW) == [((), 0)]
    assert all(store._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0 for table in TALLIES)


@pytest.mark.parametrize("given,expected", [
    ((None, None), ([], (None, None))),
    ((60_000, 180_000), ([], (1, 3))),
    ((60_001, 180_000), ([(60_001, 120_000)], (2, 3))),
    ((60_000, 179_999), ([(120_000, 179_999)], (1, 2))),
    ((60_001, 119_999), ([(60_001, 119_999)], (2, 2))),  # within one minute: the entries alone
    ((60_001, 120_005), ([(60_001, 120_005)], (2, 2))),  # across one edge, no whole minute
    ((5, None), ([(5, 60_000)], (1, None))),
    ((None, 5), ([(0, 5)], (None, 0))),
    ((100, 100), ([], (0, 0))),
])
def test_a_due_range_splits_into_whole_minutes_and_its_two_ends(given: tuple, expected: tuple) -> None:
    assert split(given) == expected


def test_a_long_range_reads_whole_hours_whole_minutes_and_the_entries_at_its_ends() -> None:
    hour = 3600_000
    assert parts((10 * hour + 61_001, 13 * hour + 120_005)) == [
        ("entries", 10 * hour + 61_001, 10 * hour + 120_000), ("entries", 13 * hour + 120_000, 13 * hour + 120_005),
        ("tally_minute", 602, 660), ("tally_minute", 780, 782), ("tally_hour", 11, 13)]
    assert parts((None, None)) == [("tally_hour", None, None)]
    assert parts((5, hour + 5), hours=False) == [("entries", 5, 60_000), ("entries", hour, hour + 5),
                                                 ("tally_minute", 1, 60)]


def test_a_version_3_file_keeps_its_entries_and_gains_its_tally(tmp_path: Path) -> None:
    path = str(tmp_path / "index.sqlite")
    store = IndexStore(path)
    store.add(entries(random.Random(4), 300, "v"))
    store.set_position("ladder.index", 42, 0)
    expected = store.count(Filter(), NOW, by="task")
    store.close()
    db = sqlite3.connect(path)  # as version 3 left it: no tally, no triggers
    db.executescript("".join(f"DROP TRIGGER {table}_insert; DROP TRIGGER {table}_delete; DROP TRIGGER {table}_cancel; "
                             f"DROP TABLE {table}; " for table in TALLIES) + "PRAGMA user_version=3;")
    db.close()
    store = IndexStore(path)
    assert store.position("ladder.index") == (42, 0) and len(store) == 300  # nothing to read again
    assert store.count(Filter(), NOW, by="task") == expected == counted(store, Filter(), NOW, "task")
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == 4
    store.close()


def test_connections_opening_one_file_at_once_all_open_it(tmp_path: Path) -> None:
    """The console's refresh thread and its page threads open one file at once. A deferred schema write that read
    before another connection committed could not take the write lock ("database is locked" at once, no busy
    wait): the schema write takes it first, and opening a current file writes nothing."""
    path = str(tmp_path / "index.sqlite")
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def opener() -> None:
        start.wait()
        for _ in range(25):
            try:
                IndexStore(path).close()
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == [] and not any(thread.is_alive() for thread in threads)



def test_two_syncs_writing_one_file_at_once_both_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command's sync beside the console's: one holds the file's write lock for a batch while the other's batch
    begins. The second waits for the lock, then writes; a batch that read first and then met the lock could not
    write once the first committed ("database is locked" at once: SQLite does not wait for the lock then)."""
    from kombu_ladder.controlplane.codec import Entries
    from kombu_ladder.index import reader as index_reader
    from kombu_ladder.notices import Notices

    path = str(tmp_path / "index.sqlite")
    IndexStore(path).close()
    one = Entry("m-1", None, "t", "", "q", NOW + 60_000, NOW, 10)
    two = Entry("m-2", None, "t", "", "q", NOW + 60_000, NOW, 10)
    first_applied, second_waits = threading.Event(), threading.Event()
    scripts: dict[int, Any] = {}

    class Stream:  # the stream reader of each sync: hands its records over, as read_to_end does
        def __init__(self, stream: str, **kwargs: Any) -> None:
            self.position: Optional[int] = None
            self.skipped: dict[str, int] = {}

        def read_to_end(self, connection: Any, *, on_record: Any, on_reset: Any = None) -> None:
            scripts[threading.get_ident()](on_record)

    def first_reads(on_record: Any) -> None:
        on_record(Entries((one,)), 0)
        first_applied.set()
        assert second_waits.wait(30)  # the batch ends (and commits) while the second's waits

    def second_reads(on_record: Any) -> None:
        on_record(Entries((two,)), 0)

    monkeypatch.setattr(index_reader, "StreamReader", Stream)
    errors: list[BaseException] = []

    def sync(script: Any, trace: bool) -> None:
        scripts[threading.get_ident()] = script
        try:
            store = IndexStore(path)  # each sync its own connection, in its own thread
            if trace:  # the second's batch reaches its first write, or asks for the lock
                store._db.set_trace_callback(lambda sql: second_waits.set() if sql.lstrip().upper().startswith(
                    ("INSERT", "BEGIN IMMEDIATE")) else None)
            index_reader._read(None, store, index_reader.INDEX, "first", index_reader.SyncResult(),
                               clock=lambda: NOW / 1000, timeout=30, notices=Notices(index_reader.logger))
            store.close()
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=sync, args=(first_reads, False))]
    threads[0].start()
    assert first_applied.wait(30), errors
    threads.append(threading.Thread(target=sync, args=(second_reads, True)))
    threads[1].start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads) and errors == []
    assert sorted(row.entry.message_id for row in IndexStore(path).listing(Filter(), NOW)) == ["m-1", "m-2"]
