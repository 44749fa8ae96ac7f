"""A RabbitMQ 4.x node with the deprecated features RabbitMQ 4.3 denies by default denied already.

4.3 cannot run here, but 4.0 can be told to refuse what 4.3 refuses: transient
non-exclusive queues and global QoS (``deprecated_features.permit.*`` in rabbitmq.conf).
On such a private node a ``-P threads`` worker with the relay runs countdown tasks and
answers ``celery inspect ladder`` when Celery's ``control_queue_exclusive`` is on, and
cannot start without it: what docs/operations.rst tells operators before they upgrade.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ladder_counters, wait_for

from .apps.faultapp import make_app
from .conftest import PrivateNode, running_private_node
from .faultkit import WorkerProcess, run_figures, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.celery]

#: What RabbitMQ 4.3 denies by default, denied on a 4.0 node.
STRICT = ("deprecated_features.permit.transient_nonexcl_queues = false\n"
          "deprecated_features.permit.global_qos = false\n")


@pytest.fixture(scope="module")
def strict_node(private_node: PrivateNode) -> Iterator[PrivateNode]:
    release = tuple(int(part) for part in private_node.version().split(".")[:2])
    if release < (4, 0):
        pytest.skip(f"RabbitMQ {private_node.version()} has no deprecated-feature switches (4.0 and later)")
    with running_private_node("ladder-strict", STRICT) as node:
        yield node


@pytest.fixture
def strict_url(strict_node: PrivateNode) -> Iterator[str]:
    vhost = strict_node.new_vhost("strict")
    try:
        yield strict_node.url(vhost)
    finally:
        strict_node.ctl("delete_vhost", vhost, check=False)


def test_a_worker_with_exclusive_control_queues_runs_countdowns_and_answers_inspect(
        strict_url: str, tmp_path: Path) -> None:
    worker = WorkerProcess(strict_url, tmp_path, exclusive_control=True)
    app = make_app(strict_url, exclusive_control=True)
    try:
        worker.start()
        rng = random.Random(43)
        sent = 20
        with app.producer_or_acquire() as producer:
            for n in range(sent):
                app.send_task("faults.record", args=[n], countdown=rng.uniform(1.0, 4.0), producer=producer)
        wait_until(lambda: len(worker.runs()) == sent, 60, "every countdown task run", worker.log)
        counters = wait_for(lambda: ladder_counters(app, timeout=5.0), 30, message="an answer to inspect ladder")
        assert run_figures(worker.runs(), sent) == {"sent": sent, "delivered": sent, "duplicated": 0, "lost": 0}
        ((_, answer),) = counters.items()
        assert answer["delivered"] >= sent
        assert worker.alive(), worker.log()
    finally:
        worker.stop()
        app.close()


def test_without_exclusive_control_queues_the_worker_cannot_start(strict_url: str, tmp_path: Path) -> None:
    """The contrast: Celery's default remote-control queue is transient and non-exclusive."""
    worker = WorkerProcess(strict_url, tmp_path, name=f"plain-{uuid.uuid4().hex[:4]}")
    try:
        worker.start(wait=False)
        wait_until(lambda: "transient_nonexcl_queues" in worker.log(), 60,
                   "the broker refusing the worker's remote-control queue", worker.log)
    finally:
        worker.stop()
