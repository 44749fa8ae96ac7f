"""Task-start lateness under mixed delays: (c) vanilla Celery ETA, (d) with the ladder, (e) native delayed delivery."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any

from .celery_app import Worker, make_app
from .common import Child, Config, Progress, Vhost, iter_lines, log, summarize
from .lateness_kombu import delays

__all__ = ["CONTENDERS", "read_records", "run_mode", "run"]

#: Contender key, Celery mode, label and whether the relay runs inside the worker.
#: ``d2`` is a diagnostic: the same ladder, its relay in a process of its own.
CONTENDERS = (("c", "vanilla", "(c) vanilla Celery ETA", True),
              ("d", "ladder", "(d) Celery with the ladder", True),
              ("d2", "ladder", "(d2) ladder, relay in its own process", False),
              ("e", "native", "(e) Celery native delayed delivery", True))


def read_records(path: str) -> list[tuple[int, float, float]]:
    """Return ``(index, due_ms, start_ms)`` for every task that started (from the worker's file)."""
    out = []
    for line in iter_lines(path):
        parts = line.split()
        if len(parts) == 3:
            out.append((int(parts[0]), float(parts[1]), float(parts[2])))
    return out


def _count(path: str) -> int:
    return sum(1 for _ in iter_lines(path))


def run_mode(config: Config, mode: str, label: str, ds: list[float], *, relay_in_worker: bool = True) -> dict[str, Any]:
    """Publish one task per delay (``eta=``, random order) to a ``mode`` worker; record when each starts."""
    fd, out = tempfile.mkstemp(prefix=f"ladder-bench-{mode}-", suffix=".txt")
    os.close(fd)
    try:
        with Vhost(f"celery-{mode}") as vhost, vhost.connection() as conn, ExitStack() as stack:
            app = make_app(mode, vhost.url, out)
            record = app.tasks["bench.record"]
            relay = None
            if not relay_in_worker:
                relay = Child([sys.executable, "-m", "bench.relay_proc", "--kind", "ours", "--url", vhost.url,
                               "--forever"], stdout=subprocess.DEVNULL)
                stack.callback(relay.stop)
            with Worker(vhost.url, mode, out, relay=relay_in_worker) as worker:
                worker.wait_ready(conn)
                progress = Progress(len(ds), f"{label[:3]} publish")
                with app.producer_or_acquire() as producer:
                    for i, delay in enumerate(ds):
                        due = int(time.time() * 1000) + round(delay * 1000)
                        eta = datetime.fromtimestamp(due / 1000, tz=timezone.utc)
                        record.apply_async((i, due), eta=eta, producer=producer)
                        if i % 50 == 0:
                            progress.update(i)
                progress.update(len(ds))
                progress.close()
                last = time.time()
                deadline = last + max(ds) + config.lateness_grace
                progress = Progress(len(ds), f"{label} task starts")
                while _count(out) < len(ds) and time.time() < deadline:
                    progress.update(_count(out))
                    time.sleep(0.2)
                started = _count(out)
                progress.update(started)
                waited = time.time() - last
                progress.close("" if started >= len(ds) else f"still waiting after {waited:.0f}s")
            app.close()
        records = read_records(out)
    finally:
        os.unlink(out)
    lateness = [start - due for _, due, start in records]
    summary = summarize(lateness, len(ds))
    if len(records) < len(ds):
        summary["still_waiting_after_s"] = round(waited)
    return {"name": label, "lateness": lateness, "summary": summary}


def run(config: Config, seed: int = 7, only: tuple[str, ...] = ("c", "d", "d2", "e")) -> dict[str, Any]:
    """Run the Celery contenders one after the other on the same delays."""
    ds = delays(config.celery_n, config.max_delay, seed)
    results = {}
    for key, mode, label, relay_in_worker in CONTENDERS:
        if key not in only:
            continue
        log(f"lateness {label}: {len(ds)} tasks, delays 1-{config.max_delay:g}s")
        results[key] = run_mode(config, mode, label, ds, relay_in_worker=relay_in_worker)
    return results
