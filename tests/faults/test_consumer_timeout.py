"""Fault: consumer_timeout lowered to 10 s; 90 s countdowns with the ladder and, in contrast, without.

RabbitMQ 4.3 no longer enforces consumer_timeout on classic queues (its release notes; measured on 4.3.6:
vanilla Celery held its 20 ETA tasks unacked for 90 s and ran them all, no channel closed). There the
contrast is that vanilla Celery's tasks are not killed either, and the ladder still holds nothing unacked.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from .apps.faultapp import make_app
from .conftest import PrivateNode
from .faultkit import WorkerProcess, run_figures, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.celery]

#: Tasks per worker, each with a 90 s countdown.
SENT = 20
COUNTDOWN = 90.0
#: The lowered timeout; RabbitMQ 3.10 checks it about once a minute.
TIMEOUT_MS = 10_000
#: What RabbitMQ says when it closes a channel for an unacked delivery.
TIMED_OUT = "PRECONDITION_FAILED"


@pytest.fixture
def low_consumer_timeout(private_node: PrivateNode) -> Iterator[None]:
    """consumer_timeout = 10 s on the private node only (channels opened afterwards read it)."""
    private_node.set_consumer_timeout(TIMEOUT_MS)
    try:
        yield
    finally:
        private_node.set_consumer_timeout(1_800_000)


def send(url: str, *, ladder: bool) -> None:
    app = make_app(url, ladder=ladder)
    try:
        for n in range(SENT):
            app.send_task("faults.record", args=[n], countdown=COUNTDOWN)
    finally:
        app.close()


def test_ladder_runs_90s_countdowns_once_where_vanilla_celery_times_out(
    low_consumer_timeout: None, private_node: PrivateNode, tmp_path: Path, report: dict[str, Any],
) -> None:
    vhosts = [private_node.new_vhost("timeout-ladder"), private_node.new_vhost("timeout-vanilla")]
    ladder_url, vanilla_url = (private_node.url(v) for v in vhosts)
    ladder = WorkerProcess(ladder_url, tmp_path, name="ladder")
    vanilla = WorkerProcess(vanilla_url, tmp_path, vanilla=True, name="vanilla")
    try:
        ladder.start()
        vanilla.start()
        started = time.monotonic()
        send(ladder_url, ladder=True)
        send(vanilla_url, ladder=False)
        wait_until(lambda: len(ladder.runs()) == SENT, COUNTDOWN + 60, "the ladder's tasks to run",
                   lambda: ladder.log()[-3000:])
        ladder_at = time.monotonic() - started
        enforced = classic_queues_enforce_consumer_timeout(private_node)
        if enforced:
            # Vanilla Celery holds every task unacked for 90 s: the broker's periodic check kills the channel.
            wait_until(lambda: TIMED_OUT in vanilla.log(), 60, "vanilla Celery's PRECONDITION_FAILED",
                       lambda: vanilla.log()[-3000:])
        else:
            wait_until(lambda: len(vanilla.runs()) >= SENT, 60, "vanilla Celery's tasks to run",
                       lambda: vanilla.log()[-3000:])
        time.sleep(3.0)  # a late duplicate of the ladder's tasks would show up here
        ladder_result = run_figures(ladder.runs(), SENT)
        vanilla_result = run_figures(vanilla.runs(), SENT)
        ladder_log, vanilla_log = ladder.log(), vanilla.log()
    finally:
        ladder.stop()
        vanilla.stop()
        for vhost in vhosts:
            private_node.ctl("delete_vhost", vhost, check=False)
    report.update(ladder_result, ran_after_s=round(ladder_at, 1), ladder_channel_errors=ladder_log.count(TIMED_OUT),
                  release=private_node.version(), classic_consumer_timeout_enforced=enforced,
                  vanilla_channel_errors=vanilla_log.count(TIMED_OUT),
                  vanilla_runs_by_then=vanilla_result["delivered"])
    assert ladder_result == {"sent": SENT, "delivered": SENT, "duplicated": 0, "lost": 0}
    assert TIMED_OUT not in ladder_log and "timed out" not in ladder_log
    assert ladder_at >= COUNTDOWN - 1.5, "the ladder's tasks ran too early"
    if enforced:
        assert "delivery acknowledgement on channel" in vanilla_log
    else:
        assert TIMED_OUT not in vanilla_log and vanilla_result["delivered"] == SENT, vanilla_log[-3000:]


def classic_queues_enforce_consumer_timeout(node: PrivateNode) -> bool:
    """Whether the node's release enforces consumer_timeout on classic queues (every release before 4.3)."""
    return tuple(int(part) for part in node.version().split(".")[:2]) < (4, 3)
