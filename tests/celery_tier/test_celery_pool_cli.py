"""``celery worker -P ladder`` as a subprocess (with --concurrency and -Q), ``inspect ladder`` and ``celery ladder``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import celery.exceptions
import pytest
from celery.utils.time import maybe_iso8601
from helpers import (
    ladder_counters,
    purge_ladder,
    queue_depth,
    temporary_vhost,
    vhost_url,
    wait_for,
    wait_for_counters,
)
from kombu import Connection, Producer, Queue

import celery_ladder
from celery_ladder.pool import POOL_PATH
from kombu_ladder.contract import CONTROL, MESSAGE_TYPE, PARKED_REASON, PARKING, rung_names
from kombu_ladder.envelope import scheduled_headers
from kombu_ladder.topology import declare as declare_topology

from .poolapp import POOL_QUEUE, make_app
from .recording import purge_queues

pytestmark = [pytest.mark.broker, pytest.mark.celery]

HERE = Path(__file__).parent

#: Delays (seconds) published out of order to the ``-P ladder`` worker.
DELAYS = (4.0, 1.5, 6.0, 2.5, 3.2, 5.1)


def celery_cli(broker_url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "celery", "-A", "poolapp", *args], cwd=HERE, env=_env(broker_url),
                          capture_output=True, text=True, timeout=timeout)


def _env(broker_url: str) -> dict[str, str]:
    return dict(os.environ, LADDER_POOL_BROKER=broker_url,
                PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


class Worker:
    """A ``celery worker -P ladder`` subprocess."""

    def __init__(self, broker_url: str, log_dir: Path, *, app: str = "poolapp", queue: str = POOL_QUEUE) -> None:
        self.hostname = f"ladder-{uuid.uuid4().hex[:6]}@test"
        self.log = log_dir / "worker.log"
        self.out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", app, "worker", "-P", "ladder", "--concurrency", "2",
             "-Q", queue, "-n", self.hostname, "-l", "info", "--without-gossip", "--without-mingle"],
            cwd=HERE, env=_env(broker_url), stdout=self.out, stderr=subprocess.STDOUT,
        )

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.out.close()
            if self.proc.returncode is None:
                self.proc.kill()

    def output(self) -> str:
        return self.log.read_text()

    def wait_relaying(self, app: Any) -> None:
        """Wait until the worker answers ``inspect ladder`` with its relay running (it died: fail)."""

        def relaying() -> bool:
            assert self.proc.poll() is None, self.output()
            return ladder_counters(app, [self.hostname], timeout=1).get(self.hostname, {}).get("relay") is True

        wait_for(relaying, timeout=60, interval=0.5, message="the -P ladder worker and its relay")


@pytest.fixture(scope="module")
def broker_url(rabbit_vhost: str) -> Iterator[str]:
    """A vhost of this module's own, in place of the session's: the counters its tests read are its worker's
    alone. In the parallel make test, a relay in the session's vhost delivered this module's tasks (the
    worker's relay counted 0 delivered, twice in two runs)."""
    with temporary_vhost(f"{rabbit_vhost}-pool-{uuid.uuid4().hex[:6]}") as vhost:
        yield vhost_url(vhost)


@pytest.fixture(scope="module")
def publisher(broker_url: str) -> Iterator[Any]:
    """The same app in this process, with the ladder installed (the producer side)."""
    with Connection(broker_url) as conn:
        purge_ladder(conn)
    purge_queues(broker_url, (POOL_QUEUE,))
    app = celery_ladder.install(make_app(broker_url))
    yield app
    app.close()


@pytest.fixture(scope="module")
def pool_worker(broker_url: str, publisher: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    worker = Worker(broker_url, tmp_path_factory.mktemp("pool-worker"))
    try:
        worker.wait_relaying(publisher)
        yield worker
    finally:
        code = worker.stop()
        assert code == 0, worker.output()


def test_pool_ladder_with_concurrency_and_queues_runs_delayed_tasks_on_time(publisher: Any,
                                                                           pool_worker: Worker) -> None:
    when = publisher.tasks["poolapp.when"]
    results = [(delay, when.apply_async(countdown=delay, queue=POOL_QUEUE)) for delay in DELAYS]
    for delay, result in results:
        try:
            got = result.get(timeout=max(DELAYS) + 20)
        except celery.exceptions.TimeoutError:  # did the worker run it? its log says
            pytest.fail(f"no result for countdown={delay} ({result.id}); the worker's log ends:\n"
                        f"{pool_worker.output()[-4000:]}")
        late = got["at"] - maybe_iso8601(got["eta"]).timestamp()
        assert -0.02 <= late <= 1.5, f"countdown={delay} ran {late:+.3f}s from its ETA"
        assert got["routing_key"] == POOL_QUEUE
    stats = publisher.control.inspect(destination=[pool_worker.hostname], timeout=5, limit=1).stats()
    pool = stats[pool_worker.hostname]["pool"]
    assert pool["implementation"] == POOL_PATH == "celery_ladder.concurrency.ladder:TaskPool"
    assert pool["max-concurrency"] == 2 and len(pool["processes"]) == 2
    assert "ladder relay consuming from acemq.schedule.due" in pool_worker.output()
    banner = re.search(r"concurrency: (.*)", pool_worker.output())
    assert banner is not None and banner.group(1).strip() == "2 (ladder)", pool_worker.output()[:2000]


def test_a_task_run_now_from_the_1h_rung_and_one_rescheduled_5s_later_run_once_on_time(
    broker_url: str, publisher: Any, pool_worker: Worker,
) -> None:
    """``celery ladder run-now`` and ``reschedule``: the task keeps its id and queue, and runs once, at its new
    time (its eta moved with it: the worker waits for the eta, not the old one)."""
    when = publisher.tasks["poolapp.when"]
    now_task = when.apply_async(countdown=2 * 3600, queue=POOL_QUEUE)
    later_task = when.apply_async(countdown=2 * 3600, queue=POOL_QUEUE)
    started = time.time()
    done = celery_cli(broker_url, "ladder", "run-now", now_task.id)
    finished = time.time()  # the move is committed before the command exits
    assert done.returncode == 0, done.stderr
    got = now_task.get(timeout=20)
    # Within a second of the command on a quiet machine; 1.5 s, as for this module's countdowns, under CI's load.
    assert started <= got["at"] <= finished + 1.5, (got["at"] - started, finished - started)
    assert got["routing_key"] == POOL_QUEUE
    print(f"\nrun-now: ran {got['at'] - finished:+.3f} s after the command returned")
    started = time.time()
    done = celery_cli(broker_url, "ladder", "reschedule", later_task.id, "5")
    finished = time.time()
    assert done.returncode == 0, done.stderr
    got = later_task.get(timeout=30)
    assert started + 5.0 <= got["at"] <= finished + 5.0 + 1.5, (got["at"] - started, finished - started)
    assert abs(maybe_iso8601(got["eta"]).timestamp() - got["at"]) < 1.5, "its eta is the new time"

    def runs() -> list[str]:  # the worker writes its log line after the result reaches the backend
        return [line for line in pool_worker.output().splitlines()
                if "succeeded" in line and (now_task.id in line or later_task.id in line)]

    wait_for(lambda: len(runs()) >= 2, 10, message="both runs in the worker's log")
    assert len(runs()) == 2, runs()


def test_inspect_ladder_reports_the_relay_counters(broker_url: str, publisher: Any, pool_worker: Worker) -> None:
    """Its own tasks, run and then counted: it reads no counter an earlier test left (under make test's
    parallel load a worker's relay may have reconnected since, with new counters: 0 delivered, twice in CI)."""
    when = publisher.tasks["poolapp.when"]
    results = [when.apply_async(countdown=delay, queue=POOL_QUEUE) for delay in (1.5, 2.5, 3.5)]
    for result in results:
        result.get(timeout=30)
    # a delivery is counted at its confirm, which may come after the task ran: wait for it, then ask the CLI
    wait_for_counters(publisher, [pool_worker.hostname], lambda seen: seen[pool_worker.hostname]["delivered"] >= 3,
                      message="the relay's count of the 3 deliveries")
    done = celery_cli(broker_url, "inspect", "ladder", "-d", pool_worker.hostname, "--json")
    assert done.returncode == 0, done.stderr
    counters = json.loads(done.stdout)[pool_worker.hostname]
    assert counters["relay"] is True
    assert set(counters) >= {"scheduled", "delivered", "hops", "malformed", "parked"}
    # every delay is below the hold window (10 s): one rung each, then held, so no relay hop
    assert counters["delivered"] >= len(results) and counters["hops"] == 0
    assert counters["malformed"] == 0 and counters["parked"] == 0


def test_celery_ladder_declare_and_status(broker_url: str, pool_worker: Worker) -> None:
    declared = celery_cli(broker_url, "ladder", "declare")
    assert declared.returncode == 0, declared.stderr
    assert declared.stdout.split() == [*rung_names(), CONTROL]
    status = celery_cli(broker_url, "ladder", "status", "--json", "--timeout", "2")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    queues = {row["queue"]: row for row in report["queues"]}
    assert set(queues) == {*rung_names(), CONTROL, PARKING}
    assert queues[CONTROL]["consumers"] >= 1, "the worker's relay consumes the control queue"
    assert report["workers"][pool_worker.hostname]["relay"] is True
    table = celery_cli(broker_url, "ladder", "status")
    assert table.returncode == 0 and pool_worker.hostname in table.stdout and "acemq.schedule.1h" in table.stdout


def test_celery_ladder_relay_runs_until_sigterm(broker_url: str, pool_worker: Worker) -> None:
    def consumers() -> int:
        with Connection(broker_url) as conn:
            return conn.default_channel.queue_declare(CONTROL, passive=True).consumer_count

    before = consumers()
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "poolapp", "ladder", "relay"], cwd=HERE,
                            env=_env(broker_url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: consumers() == before + 1, timeout=30, message="the standalone relay to consume")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "relay stopped" in out


def test_two_workers_make_competing_relays_without_duplicates(broker_url: str, publisher: Any,
                                                             pool_worker: Worker,
                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    second = Worker(broker_url, tmp_path_factory.mktemp("second-worker"))
    workers = [pool_worker.hostname, second.hostname]

    try:
        before = wait_for_counters(publisher, workers, lambda c: c[second.hostname].get("relay") is True,
                                   timeout=60, message="the second worker's relay")
        when = publisher.tasks["poolapp.when"]
        results = [when.apply_async(countdown=1.5 + (i % 10) * 0.3, queue=POOL_QUEUE) for i in range(40)]
        for result in results:
            result.get(timeout=30)

        def delivered_since(counters: dict[str, dict[str, Any]]) -> dict[str, int]:
            return {host: counters[host]["delivered"] - before[host]["delivered"] for host in workers}

        # the tasks have run; the relays count a delivery once its confirm is in, which may be a moment later
        after = wait_for_counters(publisher, workers, lambda c: sum(delivered_since(c).values()) >= len(results),
                                  message="both relays to count the confirmed deliveries")
    finally:
        assert second.stop() == 0, second.output()
    delivered = delivered_since(after)
    assert sum(delivered.values()) == len(results), f"each task is delivered exactly once: {delivered}"
    assert all(n > 0 for n in delivered.values()), f"both relays take part: {delivered}"


def test_celery_ladder_relay_keeps_to_the_apps_allow_list(fresh_vhost: str) -> None:
    """``celery ladder relay`` reads ladder_allowed_exchanges, as the workers' relay does."""
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare_topology(conn)
        Queue("allow.target", durable=True)(conn.default_channel).declare()
        Producer(conn.default_channel).publish(
            {"n": 1}, exchange="", routing_key=CONTROL, serializer="json", type=MESSAGE_TYPE,
            headers=scheduled_headers({}, exchange="", routing_key="allow.target",
                                      due_at=int(time.time() * 1000) - 5, content_type="application/json"))
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "poolapp", "ladder", "relay"], cwd=HERE,
                                env=dict(_env(url), LADDER_POOL_ALLOWED=json.dumps(["only.this"])),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: queue_depth(conn, PARKING) == 1, timeout=30, message="the refused message parked")
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert queue_depth(conn, "allow.target") == 0, "a target outside the allow-list got a delivery"
        parked = conn.default_channel.basic_get(PARKING, no_ack=True)
        assert parked.headers[PARKED_REASON].startswith("refused:"), parked.headers
