"""Hostile expiries reaching the relay inside a Celery worker: parked with a reason, the worker keeps running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Producer

from kombu_ladder import declare
from kombu_ladder.contract import CONTROL, DUE_AT
from kombu_ladder.envelope import scheduled_headers
from kombu_ladder.parking import parked_reasons

from .apps.faultapp import make_app
from .conftest import PrivateNode
from .faultkit import WorkerProcess, run_figures, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.celery]


def test_worker_relay_parks_hostile_expiries_and_keeps_running(
    private_node: PrivateNode, fault_url: str, tmp_path: Path, report: dict[str, Any],
) -> None:
    # Celery publishes a task for a direct queue through the default exchange (routing key: the
    # queue's name), so the worker's allow-list must hold "" for its tasks. "no-such-exchange" is
    # allowed but missing (deleted, or a typo in the list).
    worker = WorkerProcess(fault_url, tmp_path, allowed=["", "no-such-exchange"])
    try:
        worker.start()
        now = int(time.time() * 1000)
        with Connection(fault_url) as conn:
            declare(conn)
            producer = Producer(conn.default_channel)

            def expired(target_exchange: str, **extra: Any) -> None:
                headers = {**scheduled_headers({}, exchange=target_exchange, routing_key="k", due_at=now - 1000,
                                               content_type="application/json"), **extra}
                producer.publish({"hostile": target_exchange}, exchange="", routing_key=CONTROL,
                                 serializer="json", headers=headers)

            expired("no-such-exchange")  # a publish there would close the worker's channel (404)
            expired("amq.topic")  # exists, but is not in ladder_allowed_exchanges
            expired("faults.tasks", **{DUE_AT: "soon"})  # malformed
            app = make_app(fault_url)
            try:
                for n in range(5):
                    app.send_task("faults.record", args=[n], countdown=1.5)
            finally:
                app.close()
            wait_until(lambda: len(worker.runs()) == 5, 30, "the real tasks to run", lambda: worker.log()[-3000:])
            reasons = dict(parked_reasons(conn))
        assert worker.alive(), worker.log()[-3000:]
        assert worker.starts == 1
    finally:
        worker.stop()
    assert sum(reasons.values()) == 3, reasons
    kinds = sorted(reason.split(":")[0] for reason in reasons)
    assert kinds == ["malformed", "refused", "unroutable"], reasons
    report.update(run_figures(worker.runs(), 5), hostile=3, parked=sum(reasons.values()))
