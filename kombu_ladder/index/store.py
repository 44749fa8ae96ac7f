"""IndexStore: the index read into a local SQLite file, and the answers to find, list and count."""

from __future__ import annotations

import os
import re
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Optional, Sequence

from ..cancellation.records import LIFE, SLACK
from .query import (
    HOUR,
    MINUTE,
    TALLIES,
    WAITING,
    Filter,
    due_range,
    group_sql,
    parts,
    tally_group_sql,
    tally_where,
    where,
)
from .records import STREAM as INDEX
from .records import Entry

__all__ = ["IndexStore", "Row", "ids_of", "SCHEMA_VERSION", "KEEP_PAST_MS"]

#: The file layout's version: a file of version 3 gains the tally (see :data:`_TALLY`); one of another version is
#: rebuilt from the streams.
SCHEMA_VERSION = 4

#: How long (s) a connection waits for another one's write lock on the file (the console's refresh thread
#: writes while its pages open it; ``kombu-ladder waiting sync`` may run beside it) before "database is locked".
BUSY_TIMEOUT = 30.0

#: How long (ms) an entry is kept after its due time, so ``find`` can still say "due at ..., delivered".
KEEP_PAST_MS = 24 * 3600 * 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    message_id TEXT, task_id TEXT, task TEXT, exchange TEXT NOT NULL, routing_key TEXT NOT NULL,
    due INTEGER NOT NULL, at INTEGER NOT NULL, size INTEGER NOT NULL, cancelled INTEGER NOT NULL DEFAULT 0,
    was INTEGER);
CREATE INDEX IF NOT EXISTS entries_message_id ON entries (message_id) WHERE message_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_task_id ON entries (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_due ON entries (due, cancelled);
CREATE INDEX IF NOT EXISTS entries_target ON entries (exchange, routing_key, due, cancelled);
CREATE INDEX IF NOT EXISTS entries_task ON entries (task, due, cancelled);
CREATE TABLE IF NOT EXISTS moves (message_id TEXT, task_id TEXT, was INTEGER NOT NULL, at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS moves_message_id ON moves (message_id, was) WHERE message_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS moves_task_id ON moves (task_id, was) WHERE task_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS cancels (id TEXT PRIMARY KEY, at INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streams (name TEXT PRIMARY KEY, next_offset INTEGER NOT NULL, skipped INTEGER NOT NULL);
"""
#: A tally of buckets ``{width}`` ms wide: how many entries fall due in each, per task name, target and cancelled
#: or not, kept by triggers as entries are added, cancelled and removed.
_TALLY = """
CREATE TABLE IF NOT EXISTS {table} (
    bucket INTEGER NOT NULL, named INTEGER NOT NULL, task TEXT NOT NULL, exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL, cancelled INTEGER NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (bucket, named, task, exchange, routing_key, cancelled)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS {table}_insert AFTER INSERT ON entries BEGIN
    INSERT INTO {table} VALUES ({new}, 1) ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS {table}_delete AFTER DELETE ON entries BEGIN
    UPDATE {table} SET n = n - 1 WHERE {old};
END;
CREATE TRIGGER IF NOT EXISTS {table}_cancel AFTER UPDATE OF cancelled ON entries
WHEN old.cancelled IS NOT new.cancelled BEGIN
    UPDATE {table} SET n = n - 1 WHERE {old};
    INSERT INTO {table} VALUES ({new}, 1) ON CONFLICT DO UPDATE SET n = n + 1;
END;
"""
#: The tally's key of an entry (``{row}`` is ``new`` or ``old``), and the condition that finds its row.
_KEY = ("{row}.due / {width}, {row}.task IS NOT NULL, coalesce({row}.task, ''), {row}.exchange, {row}.routing_key, "
        "{row}.cancelled")
_OLD = ("bucket = old.due / {width} AND named = (old.task IS NOT NULL) AND task = coalesce(old.task, '') "
        "AND exchange = old.exchange AND routing_key = old.routing_key AND cancelled = old.cancelled")
#: The tallies (per minute and per hour): a count or histogram over 10,000,000 entries reads a few thousand of
#: their rows instead of every entry (see :doc:`/benchmarks`). They stay small while the combinations of task
#: name and target are few: one row per bucket and combination.
_SCHEMA += "".join(_TALLY.format(table=table, new=_KEY.format(row="new", width=width), old=_OLD.format(width=width))
                   for table, width in TALLIES.items())
#: Every table, index and trigger the schema creates.
_SCHEMA_NAMES = frozenset(re.findall(r"CREATE (?:TABLE|INDEX|TRIGGER) IF NOT EXISTS (\w+)", _SCHEMA))
#: The tallies of a version 3 file, built from its entries.
_FILL_TALLIES = [f"INSERT INTO {table} SELECT {_KEY.format(row='e', width=width)}, count(*) FROM entries e "
                 "GROUP BY 1, 2, 3, 4, 5, 6" for table, width in TALLIES.items()]

#: How long after a cancellation was written (ms) it still applies to an entry: one published before it (plus the
#: slack); a rescheduled copy's (``was`` set) while the record is live, since a relay matches a copy put into the
#: control queue by its id alone.
_REACH = "CASE WHEN {table}.was IS NULL THEN :slack ELSE :life END"
#: Marks the entries a cancellation written at ``:at`` applies to.
_MARK = ("UPDATE entries SET cancelled = 1 WHERE {column} = :id AND at <= :at + " + _REACH.format(table="entries")
         + " AND NOT cancelled")
#: Marks the entries added since ``:after`` (a rowid) that a cancellation read before applies to.
_MARK_NEW = ("UPDATE entries SET cancelled = 1 WHERE rowid > :after AND EXISTS (SELECT 1 FROM cancels c "
             "WHERE c.id IN (entries.message_id, entries.task_id) AND entries.at <= c.at + "
             + _REACH.format(table="entries") + ")")
#: The entries a rescheduled copy's entry supersedes: same message id (or task id), due at the time the copy
#: replaced, published no later than the copy's entry (plus the slack for clocks), and not that entry itself.
_SUPERSEDED = """
SELECT e.rowid FROM {first} CROSS JOIN {second} ON e.{column} = m.{column}
WHERE m.{column} IS NOT NULL AND {new} AND e.due = m.was
AND e.at <= m.at + :slack AND NOT (e.was IS m.was AND e.at = m.at)"""


def _supersede(new: str) -> str:
    """``_SUPERSEDED`` for both ids, driven from the table whose new rows are checked (``e``: the entries added
    since the rowid ``:after``, each looked up in the moves' indexes; ``m``: the moves added since ``:after``,
    each looked up in the entries' id indexes)."""
    first, second = ("entries e", "moves m") if new == "e" else ("moves m", "entries e")
    selects = [_SUPERSEDED.format(first=first, second=second, column=column, new=f"{new}.rowid > :after")
               for column in ("message_id", "task_id")]
    return f"DELETE FROM entries WHERE rowid IN ({selects[0]} UNION {selects[1]})"


#: Supersede what the entries added since ``:after`` replaced, or what replaced them.
_SUPERSEDE_BY_NEW_ENTRIES = _supersede("e")
#: Supersede what the moves added since ``:after`` replaced.
_SUPERSEDE_BY_NEW_MOVES = _supersede("m")

_COLUMNS = "e.message_id, e.task_id, e.task, e.exchange, e.routing_key, e.due, e.at, e.size, e.was"


def _statements(script: str) -> Iterator[str]:
    """The statements of ``script`` one by one (``executescript`` would commit the transaction under way)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement.strip()
            statement = ""


@dataclass(frozen=True)
class Row:
    """An entry of the index and what became of it, as far as the index knows."""

    entry: Entry
    #: ``waiting``; ``cancelled`` (a cancellation record names it); ``due`` (its due time has passed: delivered,
    #: or on its way).
    state: str


def ids_of(rows: Sequence[Row]) -> tuple[list[str], list[str], int]:
    """The ids a bulk cancel of ``rows`` records: task ids, message ids of the rows that are no task, and how many
    rows have neither (they cannot be cancelled by id)."""
    by_task = sorted({r.entry.task_id for r in rows if r.entry.task_id})
    by_message = sorted({r.entry.message_id for r in rows if r.entry.message_id and not r.entry.task_id})
    unnamed = sum(1 for r in rows if not r.entry.task_id and not r.entry.message_id)
    return by_task, by_message, unnamed


class IndexStore:
    """The index in a SQLite file at ``path`` (``":memory:"`` for tests), with the offsets read so far."""

    def __init__(self, path: str) -> None:
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 3, SCHEMA_VERSION):
            for table in ("entries", "moves", "cancels", "streams", *TALLIES):
                self._db.execute(f"DROP TABLE IF EXISTS {table}")
        if not self._current(version):
            # The write lock first (see begin): a connection opening the file as another one commits its schema
            # (the console's refresh thread and a page's thread) waits for it. A version 3 file keeps what it
            # read, and gains its tally.
            with self.transaction():
                for statement in _statements(_SCHEMA):
                    self._db.execute(statement)
                if version == 3:
                    for statement in _FILL_TALLIES:
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        #: Whether any cancellation is known (new entries are checked against them only then).
        self._cancels = self._db.execute("SELECT 1 FROM cancels LIMIT 1").fetchone() is not None
        #: Whether any rescheduled copy is known (new entries are checked against them only then).
        self._moves = self._db.execute("SELECT 1 FROM moves LIMIT 1").fetchone() is not None
        #: Whether a bulk load is under way, and whether moves it read are still to be applied to older entries.
        self._loading = self._moves_unchecked = False

    def _current(self, version: int) -> bool:
        """Whether the file is of this version with every table, index and trigger (a bulk load that was
        interrupted left its indexes to the next open): then opening it writes nothing, and takes no lock."""
        if version != SCHEMA_VERSION:
            return False
        names = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
        return _SCHEMA_NAMES <= names

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything in the block is written together, or not at all (the write lock first: see :meth:`begin`)."""
        self.begin()
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self.commit()

    @contextmanager
    def loading(self) -> Iterator[None]:
        """A bulk load (the first read of a stream): the secondary indexes are dropped for the block and built
        again after it, about three times faster than keeping them up to date row by row. A load that is
        interrupted leaves them to the next open, which builds them."""
        self.commit()
        names = [row[0] for row in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'entries' AND sql IS NOT NULL")]
        for name in names:
            self._db.execute(f"DROP INDEX {name}")
        self._loading = True
        try:
            yield
        finally:
            self._loading = False
            self.commit()
            self._db.executescript(_SCHEMA)
            if self._moves_unchecked:
                with self.transaction():
                    self._db.execute(_SUPERSEDE_BY_NEW_MOVES, {"after": 0, "slack": SLACK})
                self._moves_unchecked = False

    def begin(self) -> None:
        """Start a transaction (what is written until :meth:`commit` is written together), taking the file's
        write lock first, waiting for it up to :data:`BUSY_TIMEOUT`.

        Every write reads before it writes (the rows it follows, the entries it marks). A deferred transaction
        that read, and then found the lock taken by another connection that committed meanwhile, could not
        write ("database is locked" at once: SQLite does not wait for a lock when the read it holds is no
        longer the newest). So the store's transactions are all IMMEDIATE, and a sync opens one only when a
        batch's first record has arrived, never while it waits for the stream.
        """
        if not self._db.in_transaction:
            self._db.execute("BEGIN IMMEDIATE")

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write: inside the transaction under way, else in one of its own (:meth:`transaction`)."""
        if self._db.in_transaction:
            yield
        else:
            with self.transaction():
                yield

    def commit(self) -> None:
        """Commit the transaction under way, if any."""
        if self._db.in_transaction:
            self._db.execute("COMMIT")

    # -- writing (the reader) ----------------------------------------------------

    def add(self, entries: Iterable[Entry]) -> None:
        """Add entries (marked cancelled if a cancellation read already applies to them).

        The entry of a rescheduled copy (``was`` set) supersedes the entry of the message it replaced: that
        entry is removed, whichever of the two is read first (a producer may send its entry after the
        reschedule's), so the index keeps one entry per moved message, with its latest due time.
        """
        with self._writing():
            entries = list(entries)
            after = self._db.execute("SELECT coalesce(max(rowid), 0) FROM entries").fetchone()[0]
            moves_after = self._db.execute("SELECT coalesce(max(rowid), 0) FROM moves").fetchone()[0]
            self._db.executemany(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
                ((e.message_id, e.task_id, e.task, e.exchange, e.routing_key, e.due, e.at, e.size, e.was)
                 for e in entries))
            moved = [(e.message_id, e.task_id, e.was, e.at) for e in entries
                     if e.was is not None and (e.message_id or e.task_id)]
            if moved:
                self._db.executemany("INSERT INTO moves VALUES (?, ?, ?, ?)", moved)
                self._moves = True
            if self._moves:
                self._db.execute(_SUPERSEDE_BY_NEW_ENTRIES, {"after": after, "slack": SLACK})
            if moved:
                if self._loading:  # no id indexes on entries: once, when they are built again
                    self._moves_unchecked = True
                else:
                    self._db.execute(_SUPERSEDE_BY_NEW_MOVES, {"after": moves_after, "slack": SLACK})
            if self._cancels:
                self._db.execute(_MARK_NEW, {"after": after, "slack": SLACK, "life": LIFE})

    def cancel(self, ident: str, at: int) -> None:
        """Remember a cancellation of ``ident`` written at ``at`` (epoch ms) and mark the entries it applies to:
        those whose message id or task id is ``ident``, published before it (less the slack)."""
        with self._writing():
            self._db.execute("INSERT INTO cancels VALUES (?, ?) "
                             "ON CONFLICT (id) DO UPDATE SET at = max(at, excluded.at)", (ident, at))
            self._cancels = True
            for column in ("message_id", "task_id"):
                self._db.execute(_MARK.format(column=column), {"id": ident, "at": at, "slack": SLACK, "life": LIFE})

    def position(self, stream: str) -> tuple[Optional[int], int]:
        """The next offset to read of ``stream`` (None: never read) and how many records were skipped there."""
        found = self._db.execute("SELECT next_offset, skipped FROM streams WHERE name = ?", (stream,)).fetchone()
        return (None, 0) if found is None else (found[0], found[1])

    def set_position(self, stream: str, next_offset: int, skipped: int) -> None:
        """Remember where reading ``stream`` goes on from."""
        with self._writing():
            self._db.execute("INSERT OR REPLACE INTO streams VALUES (?, ?, ?)", (stream, next_offset, skipped))

    def forget(self, stream: str) -> None:
        """Forget where ``stream`` was read to (and every entry, for ``ladder.index``): it is read again."""
        with self._writing():
            if stream == INDEX:
                self._db.execute("DELETE FROM entries")
                for table in TALLIES:
                    self._db.execute(f"DELETE FROM {table}")
                self._db.execute("DELETE FROM moves")
                self._moves = False
            self._db.execute("DELETE FROM streams WHERE name = ?", (stream,))

    def oldest(self) -> Optional[int]:
        """When the earliest-published entry not yet cancelled was published (epoch ms); None without entries."""
        found = self._db.execute("SELECT min(at) FROM entries WHERE cancelled = 0").fetchone()[0]
        return None if found is None else int(found)

    def prune(self, now_ms: int, *, keep_ms: int = KEEP_PAST_MS) -> int:
        """Forget entries due more than ``keep_ms`` ago (and reschedules of entries due then); return how many."""
        with self._writing():
            self._db.execute("DELETE FROM moves WHERE was < ?", (now_ms - keep_ms,))
            pruned = self._db.execute("DELETE FROM entries WHERE due < ?", (now_ms - keep_ms,)).rowcount
            if pruned:
                for table in TALLIES:
                    self._db.execute(f"DELETE FROM {table} WHERE n = 0")
            return int(pruned)

    # -- reading (the operator) ----------------------------------------------------

    def _rows(self, sql: str, params: object) -> list[Row]:
        rows = []
        for *values, state in self._db.execute(sql, params):  # type: ignore[arg-type]
            rows.append(Row(Entry(*values), state))
        return rows

    def _state(self) -> str:
        return "CASE WHEN e.cancelled THEN 'cancelled' WHEN e.due <= :now THEN 'due' ELSE 'waiting' END"

    def find(self, ident: str, now_ms: int) -> list[Row]:
        """Every entry whose message id or task id is ``ident``, the latest published first."""
        sql = (f"SELECT {_COLUMNS}, {self._state()} FROM entries e WHERE e.message_id = :id "
               f"UNION ALL SELECT {_COLUMNS}, {self._state()} FROM entries e WHERE e.task_id = :id "
               "AND e.message_id IS NOT :id ORDER BY 7 DESC")
        return self._rows(sql, {"id": ident, "now": now_ms})

    def listing(self, found: Filter, now_ms: int, *, limit: int = 100, offset: int = 0) -> list[Row]:
        """The entries ``found`` covers, soonest due first, one page of ``limit`` from ``offset``."""
        condition, params = where(found, now_ms)
        sql = (f"SELECT {_COLUMNS}, {self._state()} FROM entries e WHERE {condition} "
               "ORDER BY e.due, e.rowid LIMIT :limit OFFSET :offset")
        return self._rows(sql, {**params, "limit": limit, "offset": offset})

    def count(self, found: Filter, now_ms: int, *, by: Optional[str] = None) -> list[tuple[tuple[object, ...], int]]:
        """How many entries ``found`` covers: one total, or one per group of ``by`` (largest first).

        Whole minutes are read from the tally, the two ends of the due range from the entries: a count costs the
        tally's rows in the range plus the entries of at most two minutes, however many entries there are.

        Raises:
            ValueError: ``by`` is not one of :data:`~kombu_ladder.index.query.BY`.
        """
        totals: dict[tuple[object, ...], int] = {}
        for source, first, end in parts(due_range(found, now_ms)):
            if source == "entries":
                condition, params = where(replace(found, due_after=first, due_before=end), now_ms)
                keys = group_sql(by) if by is not None else ()
                self._add_counts(totals, keys, f"count(*) FROM entries e WHERE {condition}", params)
            else:
                condition, params = tally_where(found, first, end)
                keys = tally_group_sql(by, TALLIES[source]) if by is not None else ()
                self._add_counts(totals, keys, f"sum(t.n) FROM {source} t WHERE {condition}", params)
        if by is None:
            return [((), totals.get((), 0))]
        found_groups = [(key, n) for key, n in totals.items() if n]
        if by == "due-hour":
            return sorted(found_groups)
        return sorted(found_groups, key=lambda item: (-item[1], [(value is not None, value) for value in item[0]]))

    def _add_counts(self, totals: dict[tuple[object, ...], int], keys: tuple[str, ...], select: str,
                    params: dict[str, object]) -> None:
        """Add the counts ``SELECT keys, select`` gives per group of ``keys`` to ``totals``."""
        grouped = ", ".join(keys)
        sql = f"SELECT {grouped}, {select} GROUP BY {grouped}" if keys else f"SELECT {select}"
        for *key, n in self._db.execute(sql, params):
            totals[tuple(key)] = totals.get(tuple(key), 0) + int(n or 0)

    def histogram(self, start_ms: int, width_ms: int, buckets: int, now_ms: int) -> list[int]:
        """How many waiting entries fall due in each of ``buckets`` windows of ``width_ms`` from ``start_ms``
        (the next hour by minute: ``histogram(now, 60_000, 60, now)``).

        Windows of whole minutes from a whole minute are read from the tally (and the entries of the minute under
        way); others from the entries.
        """
        if width_ms <= 0 or buckets <= 0:
            raise ValueError(f"width_ms and buckets must be positive, not {width_ms!r} and {buckets!r}")
        counts = [0] * buckets
        end = start_ms + width_ms * buckets
        if start_ms % MINUTE or width_ms % MINUTE:
            sql = (f"SELECT (e.due - :start) / :width, count(*) FROM entries e WHERE {WAITING} AND e.due >= :start "
                   "AND e.due < :end GROUP BY 1")
            params = {"start": start_ms, "width": width_ms, "end": end, "now": now_ms}
            for bucket, n in self._db.execute(sql, params):
                counts[int(bucket)] += int(n)
            return counts
        span = due_range(Filter(due_after=start_ms, due_before=end), now_ms)
        for source, first, last in parts(span, hours=not (start_ms % HOUR or width_ms % HOUR)):
            if source == "entries":
                sql = (f"SELECT (e.due - :start) / :width, count(*) FROM entries e WHERE {WAITING} "
                       "AND e.due >= :first AND e.due < :last GROUP BY 1")
            else:
                sql = (f"SELECT (t.bucket * {TALLIES[source]} - :start) / :width, sum(t.n) FROM {source} t "
                       "WHERE t.cancelled = 0 AND t.bucket >= :first AND t.bucket < :last GROUP BY 1")
            bounds = {"start": start_ms, "width": width_ms, "first": first, "last": last, "now": now_ms}
            for bucket, n in self._db.execute(sql, bounds):
                counts[int(bucket)] += int(n or 0)
        return counts

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM entries").fetchone()[0])
