"""Done-when for Celery: a revoked countdown task never runs, even when every worker restarts before it is due.

Vanilla Celery fails the same test: its revoke lives only in the memory of the workers
alive when it was sent, so the next worker runs the task.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults" / "apps"))

from faults.faultkit import WorkerProcess, wait_until  # noqa: E402

from faultapp import make_app  # noqa: E402  # isort: skip

pytestmark = [pytest.mark.broker, pytest.mark.celery]


@pytest.fixture(params=["ladder", "vanilla"])
def worker(request: pytest.FixtureRequest, broker_url: str, tmp_path: Path) -> Iterator[WorkerProcess]:
    process = WorkerProcess(broker_url, tmp_path, vanilla=request.param == "vanilla", name=request.param)
    try:
        yield process
    finally:
        process.stop()


def test_a_revoked_countdown_task_never_runs_across_a_worker_restart(broker_url: str,
                                                                     worker: WorkerProcess) -> None:
    app = make_app(broker_url, ladder=not worker.vanilla)
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_declare("faults.tasks", durable=True, auto_delete=False)
            conn.default_channel.queue_purge("faults.tasks")
        worker.start()
        sent_at = time.monotonic()
        revoked = app.send_task("faults.record", args=[1], countdown=8)
        sibling = app.send_task("faults.record", args=[2], countdown=8)
        if worker.vanilla:  # vanilla's worker holds the task in memory first (a revoke that overtook
            # the task message would make the worker discard it on receipt, which is not this test's case)
            wait_until(lambda: f"faults.record[{revoked.id}] received" in worker.log(), 20,
                       "the vanilla worker to hold the task", worker.log)
        revoked.revoke()
        worker.stop()  # the only worker; the next has a new node name and no --statedb
        worker.start()
        ready_after = time.monotonic() - sent_at
        wait_until(lambda: 2 in worker.runs(), 40, "the sibling to run", worker.log)
        ran_after = time.monotonic() - sent_at
        # On time, to the ladder's accuracy plus polling; or at once when the restarted worker is ready, if a
        # loaded machine restarts it after the due time (no task runs before a worker is there to run it).
        assert 7.0 <= ran_after <= max(12.0, ready_after + 4.0), (ran_after, ready_after)
        if worker.vanilla:  # the contrast: the revoke died with the first worker
            wait_until(lambda: 1 in worker.runs(), 20, "vanilla Celery to run the revoked task", worker.log)
            return
        wait_until(lambda: f"dropped cancelled message '{revoked.id}'" in worker.log(), 20,
                   "the relay to drop the revoked task", worker.log)
        assert worker.runs() == {2: 1}, worker.log()
        assert sibling.id != revoked.id
    finally:
        app.close()


def test_every_revoke_path_and_both_cancel_commands_cancel_a_waiting_task(broker_url: str, tmp_path: Path) -> None:
    """A task id means one thing on every path: revokes, 'celery ladder cancel' and 'kombu-ladder cancel'."""
    import subprocess
    import uuid

    from kombu import Connection

    from kombu_ladder import LadderProducer, Scheduler

    app = make_app(broker_url)
    ways = ("result", "control", "cli-revoke", "cli-cancel", "kombu-cancel", "kept")
    ids = {way: str(uuid.uuid4()) for way in ways}
    target = "t.revoke.paths"
    env = {**__import__("os").environ, "LADDER_FAULT_BROKER": broker_url, "LADDER_FAULT_RUNS": str(tmp_path / "r"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "faults" / "apps")}
    with Connection(broker_url) as conn:  # waiting first: a cancellation applies to what waits when it is written
        conn.default_channel.queue_declare(target, durable=True, auto_delete=False)
        producer = LadderProducer(conn.default_channel)
        for task_id in ids.values():  # a Celery task message: its id as correlation_id, and a 'task' header
            producer.publish(b"{}", routing_key=target, countdown=30, correlation_id=task_id,
                             headers={"task": "faults.record", "id": task_id})
    try:
        app.AsyncResult(ids["result"]).revoke()
        app.control.revoke(ids["control"])
        for args, printed in (
                (["celery", "-A", "faultapp", "control", "revoke", ids["cli-revoke"], "--timeout", "0.2"], None),
                (["celery", "-A", "faultapp", "ladder", "cancel", ids["cli-cancel"]], "recorded a cancellation for 1"),
                (["kombu_ladder", "--broker", broker_url, "cancel", ids["kombu-cancel"]],
                 "recorded a cancellation for 1")):
            done = subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True, text=True, timeout=60)
            if printed is not None:
                assert done.returncode == 0 and printed in done.stdout, done.stderr
                assert "cancelled" not in done.stdout  # it records; it does not claim what a relay will do
    finally:
        app.close()
    with Connection(broker_url) as conn, Scheduler.on(conn) as sched:
        wait_until(lambda: sched.cancelled == 5 and sched.delivered == 1, 60, "five dropped, one delivered",
                   lambda: str(sched._relay.counters.as_dict() if sched._relay else None))
        message = conn.default_channel.basic_get(target, no_ack=True)
        assert message.properties["correlation_id"] == ids["kept"]
