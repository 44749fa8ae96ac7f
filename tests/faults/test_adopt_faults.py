"""Adoption under random kill -9: a plain producer's ETA tasks, workers killed while they adopt, each task run once."""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from celery_tier.adoptapp import ADOPT_QUEUE, make_app
from celery_tier.adopting import AdoptWorker
from helpers import messages_by_queue

from .conftest import PrivateNode
from .faultkit import ladder_depth, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.celery]

#: Tasks sent, and the seconds over which they are sent (while the worker is killed twice).
SENT, SENDING = 600, 12.0
#: Their countdowns: every task is due after the kills and the restarts, so kill -9 only ever
#: interrupts adoptions, never a run (Celery acks a task before it runs it: a kill in between
#: would lose the run with or without the ladder), and never a hop: a copy's first rung is the 1m
#: one, which it leaves after the last kill (a relay killed between a hop's confirm and its ack
#: duplicates that message, as Guarantees says; with 10 s rungs a slow restart once met a hop).
DUE = (70.0, 80.0)
#: Seconds after the start by which the kills and restarts must be over: before any copy leaves its 1m rung.
FIRST_HOP = 60.0


@pytest.fixture
def worker(fault_url: str, tmp_path: Path) -> Iterator[AdoptWorker]:
    with AdoptWorker(fault_url, tmp_path) as process:
        yield process


def send(url: str, seed: int) -> None:
    """The old producer: ``SENT`` tasks without the ladder, paced over ``SENDING`` seconds."""
    app = make_app(url)
    rng = random.Random(seed)
    try:
        with app.producer_or_acquire() as producer:
            for n in range(SENT):
                app.send_task("adopt.record", args=[n], countdown=rng.uniform(*DUE), producer=producer)
                time.sleep(SENDING / SENT)
    finally:
        app.close()


def test_workers_killed_while_adopting_run_every_task_exactly_once(
        private_node: PrivateNode, fault_vhost: str, fault_url: str, worker: AdoptWorker,
        report: dict[str, Any]) -> None:
    seed = int(os.environ.get("LADDER_FAULT_SEED", time.time()))
    rng = random.Random(seed)
    app = make_app(fault_url)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_declare(ADOPT_QUEUE, durable=True, auto_delete=False)
    worker.start()
    worker.wait_ready(app)
    started = time.monotonic()
    publisher = threading.Thread(target=send, args=(fault_url, seed), daemon=True)
    publisher.start()
    kills = sorted(rng.uniform(1.0, SENDING) for _ in range(2))
    for at in kills:
        time.sleep(max(0.0, started + at - time.monotonic()))
        assert worker.alive(), worker.log()[-3000:]
        worker.kill9()
        worker.start()
        worker.wait_ready(app)
    assert time.monotonic() - started < FIRST_HOP, "the kills and restarts must be over before the first hop"
    publisher.join(60)
    adopted_by = time.monotonic() - started
    wait_until(lambda: messages_by_queue(fault_vhost, private_node.ctl).get(ADOPT_QUEUE, 0) == 0, 30,
               "every original to be adopted", worker.log)
    assert time.monotonic() - started < DUE[0], "the kills and the adoptions must be over before any task is due"
    counters = worker.counters(app)
    wait_until(lambda: len(worker.runs()) >= SENT and ladder_depth(private_node.ctl, fault_vhost) == 0, 150,
               "every task to run and the ladder to empty", worker.log)
    runs = collections.Counter(run["n"] for run in worker.runs())
    report.update(sent=SENT, kills=len(kills), kill_at_s=[round(k, 1) for k in kills], seed=seed,
                  adopted_last_worker=counters["adopted"], originals_dropped_last_worker=counters["originals_dropped"],
                  adoption_phase_s=round(adopted_by, 1), total_s=round(time.monotonic() - started, 1))
    assert set(runs) == set(range(SENT)), f"lost: {sorted(set(range(SENT)) - set(runs))[:20]} (seed {seed})"
    assert all(count == 1 for count in runs.values()), \
        f"ran twice: {sorted(n for n, c in runs.items() if c > 1)[:20]} (seed {seed})"
    assert messages_by_queue(fault_vhost, private_node.ctl).get(ADOPT_QUEUE, 0) == 0
    app.close()
