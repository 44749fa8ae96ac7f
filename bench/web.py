"""The web console's pages with ``web_n`` messages waiting: each page's render time, and a look into a deep rung.

In a vhost of its own on the shared broker:

1. ``web_n`` entries written straight to ``ladder.index`` (as the index section writes them: ten Celery task
   names, twenty targets, due times over a week, one in a hundred cancelled), and ``web_look_n`` real messages
   scheduled an hour or more ahead with ``LadderProducer(index=True)``: they wait in the 1h rung.
2. A console over the vhost (``kombu_ladder.web.console.Console``: the first sync of the index timed on its own),
   its app driven in-process by Starlette's TestClient: every page requested ``PAGE_REPEATS`` times after one
   warm-up, the median and the maximum of the whole request (routing, the index queries, rendering).
3. The look a message's page starts: the time to find the message published last (the tail of the 1h rung),
   every message looked at put back. The page itself does not wait for it (0.3 s at most; it says it is
   looking and reloads), so this is how long until its headers and body show. The "first view" row is a
   message page whose look is not kept yet (each request another real message): the page's worst case.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from typing import Any, Callable

from kombu import Queue

from kombu_ladder.index import Filter, IndexStore
from kombu_ladder.producer import LadderProducer

from .common import Config, Vhost, log, median, payload
from .index import TARGETS, TASKS, _fill

__all__ = ["run", "PAGE_REPEATS", "TARGET_MS"]

#: Timed requests per page (after one warm-up).
PAGE_REPEATS = 7
#: What a page must stay under (the issue's target), in milliseconds.
TARGET_MS = 1000.0


def _pages(ident: str) -> dict[str, str]:
    return {
        "overview": "/",
        "waiting, first page": "/waiting",
        "waiting, page at offset 50,000": "/waiting?offset=50000",
        "waiting by task": f"/waiting?task={TASKS[3]}",
        "waiting by target": f"/waiting?target=%28default%29&routing_key={TARGETS[5]}",
        "waiting by due window (a day)": "/waiting?due_after=%2B1d&due_before=%2B2d",
        "waiting, one id": f"/waiting?id={ident}",
        "message": f"/message?id={ident}",
        "bulk cancel preview (one task name)": f"/bulk-cancel?task={TASKS[3]}",
        "confirm cancel": f"/confirm/cancel?id={ident}",
        "parked": "/parked",
        "actions": "/actions",
    }


def _timed(get: Callable[[], Any]) -> dict[str, Any]:
    status = get().status_code  # warm-up: the thread's SQLite connection, the template cache
    times = []
    for _ in range(PAGE_REPEATS):
        started = time.perf_counter()
        status = get().status_code
        times.append(1000 * (time.perf_counter() - started))
    return {"median_ms": round(median(times), 1), "max_ms": round(max(times), 1), "status": status}


def _schedule(vhost: Vhost, n: int) -> list[str]:
    """``n`` real messages, due 1 to 2 hours ahead, into the 1h rung; their message ids in publish order."""
    ids = []
    with vhost.connection() as conn:
        channel = conn.channel()
        Queue("bench.web", durable=True)(channel).declare()
        producer = LadderProducer(channel, index=True)
        now_ms = int(time.time() * 1000)
        for i in range(n):
            ident = f"web-{i:07d}"
            countdown = 3600 + 3600 * i / n
            producer.publish(payload(i, now_ms + int(countdown * 1000)), routing_key="bench.web", countdown=countdown,
                             message_id=ident)
            ids.append(ident)
    return ids


def run(config: Config) -> dict[str, Any]:
    """Render every page with ``config.web_n`` entries in the index; time the look for the deepest message."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette 1.x's note that it would rather have httpx2
        from starlette.testclient import TestClient
    from kombu_ladder.web.app import create_app
    from kombu_ladder.web.console import Console
    from kombu_ladder.web.options import ConsoleOptions

    n, look_n = config.web_n, config.web_look_n
    with Vhost("web") as vhost, tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        task_ids = _fill(vhost, n, int(time.time() * 1000))
        real = _schedule(vhost, look_n)
        log(f"web: {n:,} index entries and {look_n:,} real messages in {time.perf_counter() - started:.1f}s")
        with vhost.connection() as conn:
            console = Console(conn, options=ConsoleOptions(refresh=60.0), index_path=os.path.join(tmp, "i.sqlite"))
            store = IndexStore(console.index.path)
            started = time.perf_counter()
            console.refresh(store)
            first_sync = time.perf_counter() - started
            console.sampler.sample()
            client = TestClient(create_app(console))
            waiting = console.count(Filter())
            try:
                look_started = time.perf_counter()
                look = console.look(real[-1], wait=600)
                look_s = time.perf_counter() - look_started
                pages = {name: _timed(lambda path=path: client.get(path)) for name, path in
                         _pages(task_ids[n // 2]).items()}
                # A message never looked at before, deep in the 1h rung: its page starts the look and waits 0.3 s
                # at most for it (the looks queue up behind each other: one at a time).
                fresh = iter(reversed(real[:-1]))
                pages["message, first view (starts its look)"] = _timed(
                    lambda: client.get(f"/message?id={next(fresh)}"))
            finally:
                client.close()
                store.close()
                console.stop()
    slowest = max(pages.values(), key=lambda p: p["median_ms"])
    log(f"web: slowest page median {slowest['median_ms']} ms; look {look_s:.2f}s over {look.looked_at} messages")
    return {"n": n, "waiting": waiting, "first_sync_s": round(first_sync, 2), "pages": pages,
            "look": {"n": look_n, "found": look.seen is not None, "looked_at": look.looked_at,
                     "seconds": round(look_s, 2)},
            "all_under_target": all(p["median_ms"] < TARGET_MS and p["status"] == 200 for p in pages.values())}
