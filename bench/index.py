"""The index of waiting work: what it costs producers and relays, and how fast it answers at scale.

In a vhost of its own on the shared broker:

1. **Publish cost.** ``LadderProducer.publish(countdown=3600)`` with ``index=False`` and with
   ``index=True``, and Celery's ``apply_async(countdown=3600)`` with ``ladder_index`` off and on,
   rounds alternating; rates per CPU second of this process (as in the publish-overhead section),
   the ratio of each "on" round to the "off" round just before it, median over the repeats.
2. **Relay cost.** The relay does no index work; what is checked is that the index's writes on the
   same broker do not slow it: ``relay_n`` expired messages hopped by one relay process while a
   producer schedules other messages, with the index off and then on, rounds paired as above.
3. **Scale.** ``index_n`` entries (ten Celery task names, twenty targets, due times over a week)
   written straight to ``ladder.index`` in records of 200, and a cancellation for one in a hundred;
   then the first sync into a new SQLite file, a sync with nothing new (what every command pays),
   and the latency of ``find`` by task id, a ``list`` page by task and by due window, and the
   counts (total, by task, target, due hour), medians over repeats. Then the bulk cancels
   ``waiting cancel`` makes: every waiting entry of one task name, a sync that applies them, then
   every waiting entry left, by target exchange (the index's whole size), each timed once.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import tempfile
import threading
import time
from typing import Any, Callable

from kombu import Producer, Queue

from kombu_ladder.cancellation.stream import cancel_many
from kombu_ladder.cli.waiting import bulk_cancel
from kombu_ladder.contract import rung_name
from kombu_ladder.controlplane import ENTRY
from kombu_ladder.index import Filter, IndexStore, sync
from kombu_ladder.index.records import STREAM, encode_batch, entry
from kombu_ladder.index.writer import declare_index
from kombu_ladder.producer import LadderProducer

from .celery_app import make_app
from .common import Config, Vhost, log, median, payload
from .publish import timed
from .throughput import preload_control, relay_round

__all__ = ["run", "TASKS", "TARGETS"]

#: The synthetic entries' Celery task names and target queues.
TASKS = tuple(f"billing.task_{i}" for i in range(10))
TARGETS = tuple(f"queue.{i}" for i in range(20))
#: Entries per record written for the scale section (the writer's batch).
RECORD = 200
#: Repeats of each query measured.
QUERY_REPEATS = 50


def _publish_cost(vhost: Vhost, config: Config) -> dict[str, Any]:
    n = config.publish_n
    rates: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    stack: list[Any] = []
    with vhost.connection() as conn:
        channel = conn.channel()
        Queue("bench.target", durable=True)(channel).declare()
        off = LadderProducer(channel)
        on = LadderProducer(conn.channel(), index=True)
        body = payload(0, 0)
        common: dict[str, Any] = {"exchange": "", "routing_key": "bench.target", "serializer": None,
                                  "content_type": "application/json", "delivery_mode": 2}
        for producer in (off, on):
            producer.publish(body, countdown=3600, **common)  # warm up: declares
        publishers: dict[str, Callable[[int], Any]] = {
            "kombu off": lambda i: off.publish(body, countdown=3600, message_id=f"k{i}", **common),
            "kombu on": lambda i: on.publish(body, countdown=3600, message_id=f"k{i}", **common),
        }
        try:
            for label, index in (("celery off", False), ("celery on", True)):
                app = make_app("ladder", vhost.url, os.devnull)
                app.conf.ladder_index = index
                task = app.tasks["bench.record"]
                producer_cm = app.producer_or_acquire()
                producer = producer_cm.__enter__()
                stack.append((app, producer_cm))
                task.apply_async((0, 0), countdown=3600, producer=producer)
                publishers[label] = (lambda t, p: lambda i: t.apply_async((i, 0), countdown=3600, producer=p))(
                    task, producer)
            for repeat in range(config.repeats):
                for pair in (("kombu off", "kombu on"), ("celery off", "celery on")):
                    for label in pair:
                        log(f"index publish cost: repeat {repeat + 1}/{config.repeats}, {label}")
                        cpu_rate, wall_rate = timed(n, publishers[label], f"index {label}")
                        rates.setdefault(label, []).append(cpu_rate)
                        walls.setdefault(label, []).append(wall_rate)
        finally:
            for app, producer_cm in stack:
                producer_cm.__exit__(None, None, None)
                app.close()
    ratios = {kind: median([b / a for a, b in zip(rates[f"{kind} off"], rates[f"{kind} on"])])
              for kind in ("kombu", "celery")}
    # with the index on, each publish waits for its entry's confirm before the message goes: a wall-clock cost
    wall_ratios = {kind: median([b / a for a, b in zip(walls[f"{kind} off"], walls[f"{kind} on"])])
                   for kind in ("kombu", "celery")}
    return {"n": n, "repeats": config.repeats, "rates": rates,
            "medians": {label: median(values) for label, values in rates.items()}, "ratios": ratios,
            "wall_medians": {label: median(values) for label, values in walls.items()}, "wall_ratios": wall_ratios}


def _scheduler(vhost: Vhost, n: int, stop: threading.Event, index: bool) -> None:
    """Schedule messages an hour ahead with the index ``index`` until ``stop`` (while a relay runs)."""
    with vhost.connection() as conn:
        producer = LadderProducer(conn.channel(), index=index)
        i = 0
        while not stop.is_set() and i < n:
            producer.publish(b"{}", routing_key="bench.idle", countdown=3 * 3600, message_id=f"w{i}")
            i += 1


def _relay_cost(vhost: Vhost, config: Config) -> dict[str, Any]:
    n = config.relay_n
    rounds: dict[str, list[float]] = {"off": [], "on": []}
    with vhost.connection() as conn:
        Queue("bench.idle", durable=True)(conn.default_channel).declare()
    for repeat in range(config.relay_repeats):
        for label in ("off", "on"):
            log(f"index relay cost: repeat {repeat + 1}/{config.relay_repeats}, index writes {label}")
            preload_control(vhost, n, due_in=7200, label=f"preload ({label})")
            stop = threading.Event()
            writer = threading.Thread(target=_scheduler, args=(vhost, 10 * n, stop, label == "on"))
            writer.start()
            try:
                result = relay_round(vhost, "ours", 1, expected=n)
            finally:
                stop.set()
                writer.join(60)
            with vhost.connection() as conn:  # the hopped messages, and those the writer scheduled
                conn.default_channel.queue_purge(rung_name(3600))
            rounds[label].append(result["rate"])
    ratio = median([b / a for a, b in zip(rounds["off"], rounds["on"]) if a])
    return {"n": n, "repeats": config.relay_repeats, "rates": rounds, "ratio": ratio}


def _fill(vhost: Vhost, n: int, now_ms: int) -> list[str]:
    """Write ``n`` synthetic entries to ladder.index (confirmed) and cancel one in a hundred; return the task ids."""
    rng = random.Random(7)
    ids = []
    with vhost.connection(transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        declare_index(channel)
        producer = Producer(channel)
        batch = []
        for i in range(n):
            task_id = f"{i:08d}-{rng.getrandbits(64):016x}"
            ids.append(task_id)
            batch.append(entry(message_id=None, task_id=task_id, task=TASKS[i % len(TASKS)], exchange="",
                               routing_key=TARGETS[i % len(TARGETS)], due=now_ms + rng.randrange(7 * 86400_000),
                               at=now_ms, size=600))
            if len(batch) == RECORD:
                producer.publish(encode_batch(batch), exchange=ENTRY.exchange, routing_key=STREAM,
                                 content_type="application/json", content_encoding="utf-8")
                batch = []
        if batch:
            producer.publish(encode_batch(batch), exchange=ENTRY.exchange, routing_key=STREAM,
                             content_type="application/json", content_encoding="utf-8")
        cancel_many(conn, ids[::100], key="task_id")
    return ids


def _timed(fn: Callable[[], Any], repeats: int = QUERY_REPEATS) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - started))
    return {"median_ms": round(median(times), 2), "max_ms": round(max(times), 2)}


def _scale(vhost: Vhost, config: Config) -> dict[str, Any]:
    n = config.index_n
    now_ms = int(time.time() * 1000)
    started = time.perf_counter()
    ids = _fill(vhost, n, now_ms)
    fill_s = time.perf_counter() - started
    log(f"index scale: {n} entries written in {fill_s:.1f}s")
    with tempfile.TemporaryDirectory() as tmp, vhost.connection() as conn:
        path = os.path.join(tmp, "index.sqlite")
        store = IndexStore(path)
        first = sync(conn, store)
        log(f"index scale: first sync {first.seconds:.1f}s ({first.entries} entries)")
        again = sync(conn, store)
        now = int(time.time() * 1000)
        rng = random.Random(11)
        picks = iter([ids[rng.randrange(n)] for _ in range(QUERY_REPEATS)])
        queries = {
            "find": _timed(lambda: store.find(next(picks), now)),
            "list by task": _timed(lambda: store.listing(Filter(task=TASKS[3]), now, limit=50, offset=1000)),
            "list by due window": _timed(lambda: store.listing(
                Filter(due_after=now + 86400_000, due_before=now + 2 * 86400_000), now, limit=50, offset=1000)),
            "list by target": _timed(lambda: store.listing(Filter(exchange="", routing_key=TARGETS[5]), now,
                                                           limit=50, offset=1000)),
            "count": _timed(lambda: store.count(Filter(), now), 5),
            "count by task": _timed(lambda: store.count(Filter(), now, by="task"), 5),
            "count by target": _timed(lambda: store.count(Filter(), now, by="target"), 5),
            "count by due hour": _timed(lambda: store.count(Filter(), now, by="due-hour"), 5),
        }
        waiting = store.count(Filter(), now)[0][1]
        bulk = _bulk_cancels(conn, store)
        store.close()
        size_mb = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)) / 1e6
    return {"n": n, "cancelled": len(ids[::100]), "waiting": waiting, "fill_s": round(fill_s, 1),
            "first_sync_s": round(first.seconds, 2), "first_sync_entries": first.entries,
            "again_sync_s": round(again.seconds, 3), "file_mb": round(size_mb, 1), "queries": queries,
            "bulk": bulk}


def _bulk_cancel_timed(conn: Any, store: IndexStore, found: Filter) -> tuple[int, float]:
    """``waiting cancel`` with ``found``'s filter (what it prints is dropped): how many ids, and the seconds."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        ids = bulk_cancel(conn, store, found, int(time.time() * 1000))
    return ids, time.perf_counter() - started


def _bulk_cancels(conn: Any, store: IndexStore) -> dict[str, Any]:
    """Every waiting entry of one task name cancelled, the sync that applies it, then every entry left."""
    task_ids, task_s = _bulk_cancel_timed(conn, store, Filter(task=TASKS[3]))
    log(f"index scale: bulk cancel of {task_ids} ids by task name in {task_s:.1f}s")
    applied = sync(conn, store)
    log(f"index scale: the sync applying them {applied.seconds:.1f}s ({applied.cancellations} cancellations)")
    rest_ids, rest_s = _bulk_cancel_timed(conn, store, Filter(exchange=""))
    log(f"index scale: bulk cancel of the {rest_ids} ids left, by target exchange, in {rest_s:.1f}s")
    return {"task_ids": task_ids, "task_s": round(task_s, 2), "apply_sync_s": round(applied.seconds, 2),
            "applied": applied.cancellations, "rest_ids": rest_ids, "rest_s": round(rest_s, 2)}


def run(config: Config) -> dict[str, Any]:
    """Publish cost, relay cost and the scale figures, in one vhost each."""
    with Vhost("index-publish") as vhost:
        publish = _publish_cost(vhost, config)
    with Vhost("index-relay") as vhost:
        relay = _relay_cost(vhost, config)
    with Vhost("index-scale") as vhost:
        scale = _scale(vhost, config)
    return {"publish": publish, "relay": relay, "scale": scale}
