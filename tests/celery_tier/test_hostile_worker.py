"""The hostile corpus against the relay inside a real ``celery worker -P ladder`` (tests/hostile_corpus.py).

The worker stays up through the whole corpus, seals every fate exactly as the
standalone relay does, and a task sent afterwards runs on time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import hostile_corpus as corpus
import pytest
from celery.utils.time import maybe_iso8601
from helpers import broker_release, depth_on, ladder_counters, wait_for
from kombu import Connection

import celery_ladder
from kombu_ladder.contract import CONTROL

from .poolapp import POOL_QUEUE, make_app
from .test_celery_pool_cli import Worker

pytestmark = [pytest.mark.broker, pytest.mark.celery]


@pytest.fixture
def publisher(corpus_url: str) -> Iterator[Any]:
    app = celery_ladder.install(make_app(corpus_url))
    yield app
    app.close()


@pytest.fixture
def worker(corpus_url: str, publisher: Any, tmp_path: Path) -> Iterator[Worker]:
    worker = Worker(corpus_url, tmp_path)
    try:
        wait_for(lambda: counters(publisher, worker).get("relay") is True, timeout=60, interval=0.5,
                 message="the -P ladder worker and its relay")
        yield worker
    finally:
        code = worker.stop()
    assert code == 0, worker.output()


def counters(app: Any, worker: Worker) -> dict[str, Any]:
    assert worker.proc.poll() is None, f"the worker exited:\n{worker.output()[-5000:]}"
    return ladder_counters(app, [worker.hostname], timeout=1).get(worker.hostname, {})


def test_a_pool_ladder_worker_survives_the_corpus_and_runs_a_task_on_time_afterwards(
    corpus_url: str, publisher: Any, worker: Worker,
) -> None:
    with Connection(corpus_url) as conn:
        channel = conn.channel()
        corpus.declare_targets(channel)
        ordered, _ = corpus.interleaved(int(publisher.now().timestamp() * 1000), broker_release())
        for case in ordered:
            corpus.publish(channel, case)
        want = corpus.expected_depths(ordered)
        wait_for(lambda: all(depth_on(channel, q) == n for q, n in want.items()) and depth_on(channel, CONTROL) == 0,
                 60, interval=0.2, message="every message of the corpus delivered or parked")
        reasons = corpus.check_outcomes(channel, ordered)
    expected = {"delivered": sum(c.expect != "park" for c in ordered), "hops": 1, "parked": len(reasons),
                "malformed": sum(r.startswith("malformed:") for r in reasons), "refused": 2}
    wait_for(lambda: {k: counters(publisher, worker).get(k) for k in expected} == expected, 10, interval=0.5,
             message=f"the worker's counters to read {expected}")

    when = publisher.tasks["poolapp.when"]
    got = when.apply_async(countdown=1.5, queue=POOL_QUEUE).get(timeout=30)
    late = got["at"] - maybe_iso8601(got["eta"]).timestamp()
    assert -0.02 <= late <= 1.5, f"the task after the corpus ran {late:+.3f}s from its ETA"
    log = worker.output()
    for trouble in ("Unrecoverable error", "the relay failed", "Traceback", "\x1b"):
        assert trouble not in log, log[-5000:]
