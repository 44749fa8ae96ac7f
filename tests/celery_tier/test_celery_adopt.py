"""Issue 23: a worker with the ladder adopts ETA tasks sent without it, exactly once across kill -9; the drain."""

from __future__ import annotations

import json
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from celery import Celery
from celery.utils.time import maybe_iso8601
from helpers import ladder_depth, queue_depth, rabbitmqctl, vhost_url, wait_for, wait_for_counters
from kombu import Connection

from celery_ladder.adoption import ADOPTED_HEADER
from kombu_ladder import Scheduler

from .adoptapp import ADOPT_QUEUE, make_app
from .adopting import AdoptWorker, celery_cli, lateness, peek

pytestmark = [pytest.mark.broker, pytest.mark.celery]



@pytest.fixture
def url(fresh_vhost: str) -> str:
    return vhost_url(fresh_vhost)


@pytest.fixture
def plain(url: str) -> Iterator[Celery]:
    """An old producer: the same app, without ``celery_ladder.install``."""
    app = make_app(url)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_declare(ADOPT_QUEUE, durable=True, auto_delete=False)
    yield app
    app.close()


@pytest.fixture
def worker(url: str, tmp_path: Path) -> Iterator[AdoptWorker]:
    with AdoptWorker(url, tmp_path) as process:
        yield process


def test_a_ladder_worker_adopts_a_plain_apps_eta_tasks_instead_of_holding_them(
        plain: Celery, worker: AdoptWorker, fresh_vhost: str) -> None:
    worker.start()
    worker.wait_ready(plain)
    far = plain.send_task("adopt.record", args=[0], countdown=600)
    eta = datetime.now(timezone.utc) + timedelta(seconds=15)
    later = plain.send_task("adopt.record", args=[1], eta=eta)
    soon = plain.send_task("adopt.record", args=[2], countdown=3)  # within the hold window: held, as Celery does
    wait_for_counters(plain, [worker.hostname], lambda c: c[worker.hostname]["adopted"] == 2,
                      "the worker to adopt the two tasks due after its hold window")
    scheduled = plain.control.inspect(destination=[worker.hostname], timeout=2).scheduled() or {}
    held = {entry["request"]["id"] for entry in scheduled.get(worker.hostname, [])}
    assert far.id not in held and later.id not in held, scheduled
    wait_for(lambda: {1, 2} <= {run["n"] for run in worker.runs()}, timeout=40, interval=0.2,
             message="the adopted task and the held one to run", on_timeout=worker.log)
    by_n = {run["n"]: run for run in worker.runs()}
    adopted = by_n[1]
    assert adopted["id"] == later.id and adopted["routing_key"] == ADOPT_QUEUE
    assert maybe_iso8601(adopted["eta"]) == eta, "the same id, queue and ETA as sent"
    assert -0.02 <= lateness(adopted) <= 1.5, f"the adopted task ran {lateness(adopted):+.3f}s from its ETA"
    assert ADOPTED_HEADER not in adopted["headers"], "Celery never sees the adoption header"
    assert by_n[2]["id"] == soon.id and -0.02 <= lateness(by_n[2]) <= 1.5
    assert ladder_depth(rabbitmqctl, fresh_vhost) == 1, "the task due in ten minutes waits in the ladder"
    with Connection(plain.conf.broker_url) as conn:
        assert queue_depth(conn, ADOPT_QUEUE) == 0
    counters = worker.counters(plain)
    assert (counters["adopted"], counters["originals_dropped"], counters["delivered"]) == (2, 0, 1)


@pytest.mark.parametrize("point", ["before-commit", "after-commit"])
def test_a_worker_killed_with_sigkill_mid_adoption_runs_each_task_exactly_once(
        plain: Celery, worker: AdoptWorker, fresh_vhost: str, point: str) -> None:
    worker.start(LADDER_ADOPT_DIE_AT=point)
    worker.wait_ready(plain)
    sent = 5
    for n in range(sent):
        # 40 s and more: a restarted worker on a loaded machine still finds them more than 10 s ahead,
        # so it adopts them (a task due within 10 s it would keep, as Celery does).
        plain.send_task("adopt.record", args=[n], countdown=40 + n)
    assert worker.proc is not None
    assert worker.proc.wait(30) == -signal.SIGKILL, worker.log()
    committed = ladder_depth(rabbitmqctl, fresh_vhost)
    assert (committed >= 1) if point == "after-commit" else (committed == 0)
    worker.start()  # its originals, unacked when it died, come back redelivered
    worker.wait_ready(plain)
    wait_for(lambda: len(worker.runs()) >= sent, timeout=90, interval=0.2, message="every task to run",
             on_timeout=worker.log)
    counters = worker.counters(plain)
    assert counters["originals_dropped"] == committed, "each committed copy's original is acked, not adopted again"
    assert counters["adopted"] == sent - committed
    with Connection(plain.conf.broker_url) as conn:
        assert queue_depth(conn, ADOPT_QUEUE) == 0
    assert ladder_depth(rabbitmqctl, fresh_vhost) == 0, "no copy is left to run a second time"
    assert sorted(run["n"] for run in worker.runs()) == list(range(sent)), worker.runs()
    assert all(-0.02 <= lateness(run) <= 1.5 for run in worker.runs()), worker.runs()


def test_celery_ladder_adopt_drains_the_eta_tasks_and_leaves_the_others_in_order(
        plain: Celery, url: str, fresh_vhost: str) -> None:
    # ETA, plain, ETA, plain, due soon, ETA, plain; the last ETA is 45 s ahead, so that it is still more
    # than 10 s ahead (adopted, not due soon) when the second command runs on a loaded machine.
    countdowns = [900, None, 1200, None, 3, 45, None]
    ids = [plain.send_task("adopt.record", args=[n], countdown=c).id for n, c in enumerate(countdowns)]
    assert [m.headers["id"] for m in peek(url, ADOPT_QUEUE)] == ids

    dry = celery_cli(url, "ladder", "adopt", "--queue", ADOPT_QUEUE, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [f"{ADOPT_QUEUE}: looked at 7 message(s), a dry run",
                                       "  would adopt 3 ETA task(s) into the ladder",
                                       "  would leave 4 in place: 3 without an ETA, 1 due within 10 s, 0 ladder copies",
                                       "  would ack 0 redelivered original(s) of adopted tasks"]
    assert [m.headers["id"] for m in peek(url, ADOPT_QUEUE)] == ids, "a dry run changes nothing"
    assert ladder_depth(rabbitmqctl, fresh_vhost) == 0

    done = celery_cli(url, "ladder", "adopt", "-Q", ADOPT_QUEUE, "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    assert {k: report[k] for k in ("adopted", "left", "no_eta", "due_soon", "looked_at", "dry_run")} == \
        {"adopted": 3, "left": 4, "no_eta": 3, "due_soon": 1, "looked_at": 7, "dry_run": False}
    assert [m.headers["id"] for m in peek(url, ADOPT_QUEUE)] == [ids[1], ids[3], ids[4], ids[6]], \
        "the tasks without an ETA (and the one due soon) stay where they were, in order"
    assert ladder_depth(rabbitmqctl, fresh_vhost) == 3

    with Connection(url) as conn, Scheduler.on(conn):  # a relay: the task due in 45 s comes back to its queue
        wait_for(lambda: ids[5] in [m.headers["id"] for m in peek(url, ADOPT_QUEUE)], timeout=70, interval=0.5,
                 message="the ladder to deliver the drained task")
    (delivered,) = [m for m in peek(url, ADOPT_QUEUE) if m.headers["id"] == ids[5]]
    assert delivered.headers[ADOPTED_HEADER] == delivered.headers["eta"] and delivered.headers["task"] == "adopt.record"
    assert not any(name.startswith("x-") for name in delivered.headers)

    missing = celery_cli(url, "ladder", "adopt", "--queue", "nope")
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1] == \
        "Error: queue 'nope' does not exist", missing.stderr
