"""Beside Celery's native delayed delivery (5.5+): with the ladder installed, the ladder wins.

The app's queue is a quorum queue bound to a topic exchange, with publisher confirms:
exactly what makes Celery 5.5+ readdress every countdown task to ``celery_delayed_27``
and its workers declare the 28-level ``celery_delayed_*`` topology. With
``celery_ladder.install(app)`` the task waits in the ladder instead, a ``-P ladder``
worker runs it on time, and nothing ever enters ``celery_delayed_*``. With
``ladder_enabled = False`` the same app goes back to native delayed delivery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import celery
import pytest
from celery.utils.time import maybe_iso8601
from helpers import list_bindings, list_exchanges, messages_by_queue, vhost_url, wait_for, wait_for_counters

import celery_ladder
from celery_ladder.publish import NATIVE_DELAYED_PREFIX, scheduled_count

from .nativeapp import NATIVE_EXCHANGE, NATIVE_KEY, NATIVE_QUEUE, make_app
from .test_celery_pool_cli import Worker

pytestmark = [
    pytest.mark.broker, pytest.mark.celery,
    pytest.mark.skipif(celery.VERSION < (5, 5), reason="Celery has native delayed delivery from 5.5 on; before "
                       "it, its workers cannot consume a quorum queue (global QoS)"),
]

#: Countdowns (seconds), published out of order.
DELAYS = (3.0, 1.5, 4.5, 2.2)


def ran(app: Any, hostname: str, count: int) -> dict[str, int]:
    """How many times each task ran on worker ``hostname`` (``inspect stats``), once ``count`` in all did.

    A prefork worker counts a task when its parent reads the child's "accepted" from the pipe,
    and that can come after the child stored the result the test already got. So the tally is
    waited for, then compared whole: a task run twice shows as one too many.
    """
    totals: dict[str, int] = {}

    def counted() -> bool:
        stats = app.control.inspect(destination=[hostname], timeout=5, limit=1).stats() or {}
        totals.clear()
        totals.update(stats.get(hostname, {}).get("total", {}))
        return sum(totals.values()) >= count

    wait_for(counted, timeout=30, interval=0.2, message=f"the worker to count {count} task(s) run",
             on_timeout=lambda: f"last tally: {totals}")
    return dict(totals)


def waiting(vhost: str, prefix: str) -> dict[str, int]:
    """Messages (ready or not) in each queue of ``vhost`` whose name starts with ``prefix``."""
    return {name: n for name, n in messages_by_queue(vhost).items() if name.startswith(prefix)}


@pytest.fixture
def native_setup(fresh_vhost: str, tmp_path: Path) -> Iterator[tuple[str, Any, Worker]]:
    url = vhost_url(fresh_vhost)
    publisher = celery_ladder.install(make_app(url))
    worker = Worker(url, tmp_path, app="nativeapp", queue=NATIVE_QUEUE)
    try:
        worker.wait_relaying(publisher)
        # Native delayed delivery is armed: the worker's own bootstep declared its topology. It declares
        # celery_delayed_27 first and binds the task queue last, one synchronous step at a time (28 quorum
        # queues: a second or more); a task sent in between is unroutable at some level and never runs.
        armed = (NATIVE_EXCHANGE, NATIVE_QUEUE, f"#.{NATIVE_KEY}")
        wait_for(lambda: "celery_delayed_27" in list_exchanges(fresh_vhost)
                 and armed in list_bindings(fresh_vhost), timeout=30, interval=0.2,
                 message=f"Celery's native delayed-delivery topology (celery_delayed_27 ... the binding {armed})")
        yield fresh_vhost, publisher, worker
    finally:
        code = worker.stop()
        publisher.close()
        assert code == 0, worker.output()


def test_the_ladder_delays_instead_of_native_delayed_delivery_and_runs_each_task_once_on_time(
        native_setup: tuple[str, Any, Worker]) -> None:
    vhost, publisher, worker = native_setup
    when = publisher.tasks["nativeapp.when"]
    before = scheduled_count()
    results = [(delay, when.apply_async(countdown=delay)) for delay in DELAYS]
    assert scheduled_count() - before == len(DELAYS)  # handed to the ladder
    for delay, result in results:
        got = result.get(timeout=max(DELAYS) + 20)
        late = got["at"] - maybe_iso8601(got["eta"]).timestamp()
        assert -0.02 <= late <= 1.5, f"countdown={delay} ran {late:+.3f}s from its ETA"
        # Delivered to the task's own exchange and key, not native's binary-prefixed one.
        assert (got["exchange"], got["routing_key"]) == (NATIVE_EXCHANGE, NATIVE_KEY)
    assert ran(publisher, worker.hostname, len(DELAYS)) == {"nativeapp.when": len(DELAYS)}, "a task ran twice"
    assert sum(waiting(vhost, NATIVE_DELAYED_PREFIX).values()) == 0
    # a delivery is counted once confirmed, which may come after the task ran
    ladder = wait_for_counters(publisher, [worker.hostname], lambda c: c[worker.hostname]["delivered"] >= len(DELAYS),
                               message="the relay to count its confirmed deliveries")
    assert ladder[worker.hostname]["delivered"] == len(DELAYS)


def test_with_ladder_enabled_false_native_delayed_delivery_takes_over(native_setup: tuple[str, Any, Worker]) -> None:
    vhost, publisher, worker = native_setup
    publisher.conf.ladder_enabled = False
    before = scheduled_count()
    result = publisher.tasks["nativeapp.when"].apply_async(countdown=2)
    assert scheduled_count() == before
    got = result.get(timeout=30)
    assert got["at"] >= maybe_iso8601(got["eta"]).timestamp() - 0.02
    # It came through native's levels: its routing key carries their 28 binary digits.
    *levels, key = got["routing_key"].split(".", 28)
    assert len(levels) == 28 and set(levels) <= {"0", "1"} and key == NATIVE_KEY, got["routing_key"]
    assert ran(publisher, worker.hostname, 1) == {"nativeapp.when": 1}
    ladder = wait_for_counters(publisher, [worker.hostname], lambda c: True, message="the worker's ladder counters")
    assert ladder[worker.hostname]["delivered"] == 0, "the ladder relayed a task native delayed delivery had"
