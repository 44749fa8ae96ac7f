"""Worker footprint: N tasks with countdown=3600, vanilla Celery versus Celery with the ladder."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from .celery_app import QUEUE, Worker, make_app
from .common import Config, Progress, Vhost, iter_lines, log, queue_counts, rss_kb

__all__ = ["PLAIN", "run_mode", "run"]

#: The index of the plain task (no countdown) sent after the waiting ones.
PLAIN = -1

#: Seconds to let the worker's RSS settle before the baseline and after the plain task ran.
SETTLE = 2.0


def _plain_started(path: str) -> float | None:
    for line in iter_lines(path):
        parts = line.split()
        if len(parts) == 3 and int(parts[0]) == PLAIN:
            return float(parts[2])
    return None


def _held(vhost: str) -> tuple[int, int]:
    """``(ready, unacked)`` of the task queue."""
    ready, unacked = queue_counts(vhost).get(QUEUE, [0, 0])
    return ready, unacked


def run_mode(config: Config, mode: str) -> dict[str, Any]:
    """Send ``footprint_n`` countdown=3600 tasks then one plain task; measure what the worker holds."""
    n = config.footprint_n
    fd, out = tempfile.mkstemp(prefix=f"ladder-bench-footprint-{mode}-", suffix=".txt")
    os.close(fd)
    try:
        with Vhost(f"footprint-{mode}") as vhost, vhost.connection() as conn:
            app = make_app(mode, vhost.url, out)
            record = app.tasks["bench.record"]
            with Worker(vhost.url, mode, out) as worker:
                worker.wait_ready(conn)
                time.sleep(SETTLE)
                rss0 = rss_kb(worker.pid)
                progress = Progress(n, f"{mode} publish countdown=3600")
                t0 = time.perf_counter()
                with app.producer_or_acquire() as producer:
                    for i in range(n):
                        record.apply_async((i, 0), countdown=3600, producer=producer)
                        if i % 500 == 0:
                            progress.update(i)
                    publish_s = time.perf_counter() - t0
                    progress.update(n)
                    progress.close(f"{n / publish_s:.0f}/s")
                    sent = time.time() * 1000
                    record.apply_async((PLAIN, sent), producer=producer)
                deadline = time.monotonic() + config.footprint_wait
                progress = Progress(int(config.footprint_wait), f"{mode} waiting for the plain task (s)")
                samples = []
                next_sample = 0.0
                while _plain_started(out) is None and time.monotonic() < deadline:
                    waited = config.footprint_wait - (deadline - time.monotonic())
                    if waited >= next_sample:
                        ready, unacked = _held(vhost.name)
                        samples.append({"t": round(waited, 1), "unacked": unacked, "rss_kb": rss_kb(worker.pid)})
                        next_sample = waited + 5.0
                    progress.update(int(waited), f"held {samples[-1]['unacked']}")
                    time.sleep(0.2)
                started = _plain_started(out)
                waited_s = time.time() - sent / 1000
                if started is not None:
                    time.sleep(SETTLE)
                rss1 = rss_kb(worker.pid)
                ready, unacked = _held(vhost.name)
                progress.close("ran" if started is not None else f"still waiting after {waited_s:.0f}s")
            app.close()
    finally:
        os.unlink(out)
    return {
        "mode": mode, "n": n, "publish_per_s": n / publish_s,
        "rss_growth_kb": rss1 - rss0, "rss_before_kb": rss0, "rss_after_kb": rss1,
        "unacked": unacked, "in_queue": ready,
        "plain_wait_ms": (started - sent) if started is not None else None,
        "still_waiting_after_s": None if started is not None else round(waited_s),
        "samples": samples,
    }


def run(config: Config) -> dict[str, Any]:
    """Vanilla first, then the ladder, each with a fresh worker in a fresh vhost."""
    results = {}
    for mode in ("vanilla", "ladder"):
        log(f"worker footprint: {mode}, {config.footprint_n} tasks with countdown=3600, "
            f"plain task bounded at {config.footprint_wait:g}s")
        results[mode] = run_mode(config, mode)
        r = results[mode]
        log(f"  {mode}: RSS +{r['rss_growth_kb'] / 1024:.1f} MB, {r['unacked']} held, plain task "
            + (f"ran after {r['plain_wait_ms']:.0f} ms" if r["plain_wait_ms"] is not None
               else f"still waiting after {r['still_waiting_after_s']} s"))
    return results
