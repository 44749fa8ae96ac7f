"""The index's store at ten million entries, and the live cancellations' memory: no broker, a SQLite file of its own.

Run: ``python -m bench.index_store [--n N] [--page]`` (``make bench-index``). It fills a new
:class:`~kombu_ladder.index.IndexStore` directly with ``N`` synthetic entries (ten million by default: fifty Celery
task names, each with its queue, due times uniform over the next 24 hours, one in a hundred cancelled by task id)
in batches of 1,000 inside :meth:`~kombu_ladder.index.IndexStore.loading`, as a first sync writes them; then
times what an operator asks of it, medians of repeats: ``find`` by id, a count by task name and by target, the
counts grouped by task and by target, and the console's pages (its overview and its waiting list). It also
measures what the relay's live set keeps per cancellation (:func:`bench.cancellations.memory`). The figures go
to ``docs/_data/bench-index-store.json``; ``--page`` (re)writes their section of ``docs/benchmarks.md`` from
that file, as ``make bench`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
import time
import uuid
from typing import Any, Callable, Iterator

from kombu_ladder.index import Filter, IndexStore
from kombu_ladder.index.query import TALLIES
from kombu_ladder.index.records import Entry

from .common import ROOT, log, median

__all__ = ["run", "section", "page_section", "write_page", "DATA", "TITLE"]

#: Where the figures are kept (the page's section is rendered from it).
DATA = os.path.join(ROOT, "docs", "_data", "bench-index-store.json")
#: The section's heading on docs/benchmarks.md.
TITLE = "## 12. The index's store at scale, and cancellations in memory"
#: The synthetic entries' Celery task names; each task's queue is its target (as Celery routes a task).
TASKS = tuple(f"app.tasks.task_{i:02d}" for i in range(50))
#: Entries per batch written (as a sync commits them).
BATCH = 1000
#: Repeats of each query timed (the slower ones: a tenth).
REPEATS = 51
#: The targets: each query below that must stay instant at ten million entries, in ms.
TARGETS_MS = {"find": 10.0, "count by task": 100.0, "count by target": 100.0, "console page": 300.0}
#: The live set's target, bytes per cancellation.
TARGET_BYTES = 100.0


def _entries(n: int, now_ms: int, ids: list[str]) -> Iterator[list[Entry]]:
    """``n`` entries in batches; every thousandth task id is kept in ``ids`` (for ``find``)."""
    rng = random.Random(38)
    batch: list[Entry] = []
    for i in range(n):
        task = TASKS[rng.randrange(len(TASKS))]
        task_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if i % 1000 == 0:
            ids.append(task_id)
        batch.append(Entry(None, task_id, task, "", task, now_ms + rng.randrange(86_400_000), now_ms, 600))
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


#: The rest of the entries past the first ``timed`` ones, made by SQLite itself (``:k`` rows; the triggers keep the
#: tallies as for any insert): a task name of the fifty, a random 128-bit task id, due within 24 hours, in the time a
#: bench can afford. SQLite evaluates ``random()`` again for each use of ``r.task``, so the queue is drawn apart from
#: the task name: up to 2,500 pairs, a harder case for the tallies than :func:`_entries`' one queue per task.
_FILL_SQL = """
WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < :k),
     r(task, id, due) AS (SELECT printf('app.tasks.task_%02d', abs(random()) % 50), lower(hex(randomblob(16))),
                                 :now + abs(random()) % 86400000 FROM k)
INSERT INTO entries (message_id, task_id, task, exchange, routing_key, due, at, size)
SELECT NULL, id, task, '', task, due, :now, 600 FROM r"""


def _timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    fn()  # warm the cache: an operator's second question
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - started))
    return {"median_ms": round(median(times), 2), "max_ms": round(max(times), 2), "repeats": repeats}


def _console_pages(store: IndexStore, now: int) -> dict[str, Callable[[], Any]]:
    """The store queries of the console's overview and waiting-list pages (``kombu_ladder.web.console``)."""
    def overview() -> None:
        store.histogram(now // 60_000 * 60_000, 60_000, 60, now)
        store.histogram(now // 3_600_000 * 3_600_000, 3_600_000, 24, now)
        store.count(Filter(), now)

    def waiting() -> None:
        store.count(Filter(), now)
        store.listing(Filter(), now, limit=50, offset=0)

    def waiting_by_task() -> None:
        store.count(Filter(task=TASKS[7]), now)
        store.listing(Filter(task=TASKS[7]), now, limit=50, offset=0)

    return {"console page: overview": overview, "console page: waiting": waiting,
            "console page: waiting by task": waiting_by_task}


def store_figures(n: int, directory: str, *, timed_n: int = 0) -> dict[str, Any]:
    """Fill a store of ``n`` entries in ``directory`` and time its answers.

    ``timed_n`` (when not 0) is how many are added as a sync adds them, its insert rate timed; the rest are made
    by SQLite (see :data:`_FILL_SQL`) to save the time the Python side would take.
    """
    path = os.path.join(directory, "index.sqlite")
    store = IndexStore(path)
    now = int(time.time() * 1000)
    ids: list[str] = []
    started = time.perf_counter()
    timed_n = timed_n or n
    with store.loading():
        for i, batch in enumerate(_entries(timed_n, now, ids)):
            with store.transaction():
                store.add(batch)
            if i % 1000 == 999:
                log(f"index store: {(i + 1) * BATCH:,} entries in {time.perf_counter() - started:.0f} s")
        loaded = time.perf_counter() - started
        log(f"index store: {timed_n:,} entries added in {loaded:.0f} s")
        made = time.perf_counter()
        for done in range(timed_n, n, 1_000_000):
            with store.transaction():
                store._db.execute(_FILL_SQL, {"k": min(1_000_000, n - done), "now": now})
            log(f"index store: {min(done + 1_000_000, n):,} entries")
        made_s = time.perf_counter() - made
        log(f"index store: {n:,} entries; building its indexes")
    fill_s = time.perf_counter() - started - made_s
    started = time.perf_counter()
    with store.transaction():
        for ident in ids[::10]:
            store.cancel(ident, now)
    cancel_s = time.perf_counter() - started
    store.close()
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    store = IndexStore(path)
    rng = random.Random(7)
    picks = iter([rng.choice(ids) for _ in range(REPEATS + 1)])
    slow = max(3, REPEATS // 10)
    queries: dict[str, Callable[[], Any]] = {
        "find": lambda: store.find(next(picks), now),
        "count by task": lambda: store.count(Filter(task=TASKS[3]), now),
        "count by target": lambda: store.count(Filter(exchange="", routing_key=TASKS[5]), now),
        "count, grouped by task": lambda: store.count(Filter(), now, by="task"),
        "count, grouped by target": lambda: store.count(Filter(), now, by="target"),
        "count, all waiting": lambda: store.count(Filter(), now),
        **_console_pages(store, now),
    }
    timed = {name: _timed(fn, REPEATS if name == "find" else slow) for name, fn in queries.items()}
    waiting = store.count(Filter(), now)[0][1]
    tally = {table: store._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TALLIES}
    store.close()
    return {"n": n, "tasks": len(TASKS), "cancelled": len(ids[::10]), "waiting": waiting, "tally_rows": tally,
            "timed_n": timed_n, "made_s": round(made_s, 1),
            "fill_s": round(fill_s, 1), "insert_s": round(loaded, 1), "inserts_per_s": round(timed_n / loaded),
            "indexes_s": round(fill_s - loaded, 1), "cancel_s": round(cancel_s, 2), "file_bytes": size,
            "bytes_per_entry": round(size / n, 1), "queries": timed}


def run(n: int = 10_000_000, cancellations: int = 1_000_000, timed_n: int = 0) -> dict[str, Any]:
    """The store's figures at ``n`` entries and the live set's at ``cancellations``."""
    from .cancellations import memory

    started, load = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), os.getloadavg()
    live = memory(cancellations) if cancellations else _kept_live_set()
    log(f"live set: {live['bytes_per_id']} bytes per cancellation")
    with tempfile.TemporaryDirectory(prefix="ladder-index-") as directory:
        figures = store_figures(n, directory, timed_n=timed_n)
    return {"started": started, "load": load, "store": figures, "live_set": live}


def _kept_live_set() -> dict[str, Any]:
    """The live set's figures of the last run (``--cancellations 0`` measures them again only then)."""
    with open(DATA, encoding="utf-8") as fh:
        return dict(json.load(fh)["live_set"])


def _verdict(value: float, bound: float) -> str:
    return "met" if value <= bound else "**missed**"


def section(data: dict[str, Any]) -> list[str]:
    """The page's section for the figures ``data`` (as :func:`run` returns them)."""
    store, live = data["store"], data["live_set"]
    queries = store["queries"]
    load = ", ".join(f"{x:.2f}" for x in data["load"])
    lines = [
        TITLE, "",
        f"`make bench-index` ({data['started']} UTC, load average {load} at its start): no broker, a SQLite "
        f"file of its own. {store['n']:,} synthetic entries ({store['tasks']} Celery task names, due times uniform "
        "over the next 24 hours): the first "
        f"{store.get('timed_n', store['n']):,} added to a new store in batches of 1,000 as a first sync adds them "
        "(their rate is the first sync's writes, decoding aside), the rest made by SQLite itself in "
        f"{store.get('made_s', 0)} s, the triggers keeping the tallies as for any entry (the first go each to its "
        "task's queue; SQLite draws the queue apart from the task name, so the tallies hold up to 2,500 task and "
        "queue pairs a minute, fifty times what one queue per task makes); then "
        f"{store['cancelled']:,} "
        "cancelled by task id. Each query is timed after one warm-up, median of the repeats shown; the console's "
        "pages are the store queries they run (rendering is section 11's). Memory per live cancellation: "
        f"{live['n']:,} ids (36-character UUIDs) added to the relay's live set and pruned, as a relay does once "
        "it has read them; every object the set then reaches, counted once.", "",
        "| measure | value | target |", "|---|---|---|",
        f"| entries added, first sync's writes (indexes built after) | {store['insert_s']} s "
        f"({store['inserts_per_s']:,}/s) + {store['indexes_s']} s | |",
        f"| the SQLite file, {store['n']:,} entries | {store['file_bytes'] / 1e9:.2f} GB ({store['bytes_per_entry']} bytes an entry) | |",
        f"| the tallies' rows (per minute / hour, task name, target) | {store['tally_rows']['tally_minute']:,} / "
        f"{store['tally_rows']['tally_hour']:,} | |",
        f"| cancel {store['cancelled']:,} ids in the store | {store['cancel_s']} s | |",
    ]
    for name, q in queries.items():
        bound = TARGETS_MS.get("console page" if name.startswith("console page") else name)
        target = f"≤ {bound:g} ms: {_verdict(q['median_ms'], bound)}" if bound is not None else ""
        lines.append(f"| {name} (median of {q['repeats']}, max) | {q['median_ms']} ms ({q['max_ms']} ms) | {target} |")
    lines.append(f"| memory per live cancellation, {live['n']:,} live | {live['bytes_per_id']} bytes "
                 f"({live['mib']} MiB) | ≤ {TARGET_BYTES:g} bytes: {_verdict(live['bytes_per_id'], TARGET_BYTES)} |")
    return lines


def page_section(path: str = DATA) -> list[str]:
    """The section from the figures kept at ``path`` (and a blank line), or nothing when there are none yet."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [*section(json.load(fh)), ""]


def write_page(data: dict[str, Any], page: str = os.path.join(ROOT, "docs", "benchmarks.md")) -> None:
    """Put the section for ``data`` into ``page``: in place of its own, or before the reading."""
    with open(page, encoding="utf-8") as fh:
        text = fh.read()
    body = "\n".join(section(data)) + "\n\n"
    own = re.compile(re.escape(TITLE) + r"\n.*?(?=^## )", re.S | re.M)
    text = own.sub(lambda _: body, text) if own.search(text) else text.replace("## Reading\n", body + "## Reading\n")
    with open(page, "w", encoding="utf-8") as fh:
        fh.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.index_store", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000_000, help="entries in the store (default 10,000,000)")
    parser.add_argument("--cancellations", type=int, default=1_000_000, help="live cancellations measured (0: keep the last run's figure)")
    parser.add_argument("--timed", type=int, default=1_000_000,
                        help="entries added as a sync adds them (the rest made by SQLite); 0: all of them")
    parser.add_argument("--page", action="store_true", help="only write the page's section from the data file")
    args = parser.parse_args()
    if not args.page:
        data = run(args.n, args.cancellations, args.timed)
        with open(DATA, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        log(f"wrote {DATA}")
    with open(DATA, encoding="utf-8") as fh:
        write_page(json.load(fh))


if __name__ == "__main__":
    main()
