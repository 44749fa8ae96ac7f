"""Adoption in an installed app's worker (ladder_relay=True): a plain producer's tasks, revokes, ladder_adopt=False."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from celery import Celery
from helpers import ladder_counters, queue_depth, wait_for, wait_for_counters
from kombu import Connection

from kombu_ladder.contract import rung_names

from .recording import relay_of

pytestmark = [pytest.mark.broker, pytest.mark.celery]

#: Seconds ahead the plain producer's tasks are due: past the hold window (10 s), so they are adopted.
AHEAD = 12


@pytest.fixture
def old_producer(celery_app: Any) -> Iterator[Celery]:
    """An app that was not upgraded: no ``celery_ladder.install``, the same broker."""
    app = Celery("old", broker=celery_app.conf.broker_url, set_as_current=False)
    yield app
    app.close()


def in_ladder(url: str) -> int:
    with Connection(url) as conn:
        return sum(queue_depth(conn, rung, if_missing=0) for rung in rung_names())


def scheduled(app: Any, worker: Any) -> set[str]:
    """The ids of the ETA tasks ``worker`` holds in memory (``celery inspect scheduled``)."""
    answer = app.control.inspect(destination=[worker.hostname], timeout=2).scheduled() or {}
    return {entry["request"]["id"] for entry in answer.get(worker.hostname, [])}


def counters(app: Any, worker: Any) -> dict[str, Any]:
    return ladder_counters(app, [worker.hostname])[worker.hostname]


def test_an_installed_apps_worker_adopts_an_old_producers_task(celery_app: Any, celery_worker: Any,
                                                               old_producer: Celery) -> None:
    assert celery_worker.consumer.ladder_adopt is not None and relay_of(celery_worker) is not None
    before = counters(celery_app, celery_worker)
    sent = old_producer.send_task("t.stamp", args=["adopted"], countdown=AHEAD, queue="celery")
    wait_for_counters(celery_app, [celery_worker.hostname],
                      lambda c: c[celery_worker.hostname]["adopted"] == before["adopted"] + 1, "the adoption")
    assert in_ladder(celery_app.conf.broker_url) == 1 and sent.id not in scheduled(celery_app, celery_worker)
    wait_for(lambda: celery_app.recorder.of("adopted"), timeout=AHEAD + 10, message="the task to run")
    (run,) = celery_app.recorder.of("adopted")
    assert run.routing_key == "celery" and run.headers == {}
    assert celery_app.AsyncResult(sent.id).id == sent.id


@pytest.mark.parametrize("celery_overrides", [{"ladder_adopt": False}])
def test_ladder_adopt_false_leaves_the_task_to_the_worker_as_celery_does(celery_app: Any, celery_worker: Any,
                                                                          old_producer: Celery,
                                                                          celery_overrides: dict[str, Any]) -> None:
    assert getattr(celery_worker.consumer, "ladder_adopt", None) is None and relay_of(celery_worker) is not None
    sent = old_producer.send_task("t.stamp", args=["held"], countdown=AHEAD, queue="celery")
    wait_for(lambda: sent.id in scheduled(celery_app, celery_worker), timeout=10,
             message="the worker to hold the task in memory")
    assert in_ladder(celery_app.conf.broker_url) == 0 and counters(celery_app, celery_worker)["adopt"] is False
    wait_for(lambda: celery_app.recorder.of("held"), timeout=AHEAD + 10, message="the held task to run")


@pytest.mark.parametrize("revoker", ["installed", "old"])
def test_a_revoke_applies_to_an_adopted_task(celery_app: Any, celery_worker: Any, old_producer: Celery,
                                             revoker: str) -> None:
    """Revoked after its adoption, by an installed app (recorded for the relays) or an old one (the workers'
    memory only): either way the task never runs, while a sibling due at the same time does."""
    before = counters(celery_app, celery_worker)
    revoked = old_producer.send_task("t.stamp", args=["revoked"], countdown=AHEAD, queue="celery")
    old_producer.send_task("t.stamp", args=["sibling"], countdown=AHEAD, queue="celery")
    wait_for_counters(celery_app, [celery_worker.hostname],
                      lambda c: c[celery_worker.hostname]["adopted"] == before["adopted"] + 2, "both adoptions")
    (celery_app if revoker == "installed" else old_producer).control.revoke(revoked.id)
    wait_for(lambda: celery_app.recorder.of("sibling"), timeout=AHEAD + 10, message="the sibling to run")
    after = wait_for_counters(celery_app, [celery_worker.hostname],
                              lambda c: c[celery_worker.hostname]["delivered"] + c[celery_worker.hostname]["cancelled"]
                              >= before["delivered"] + before["cancelled"] + 2, "both copies to leave the ladder")
    dropped_by_relay = after[celery_worker.hostname]["cancelled"] - before["cancelled"]
    if revoker == "installed":  # recorded in ladder.cancellations: the relay drops the copy
        assert dropped_by_relay == 1, after
    else:  # delivered: the worker discards it as revoked, as Celery does
        assert dropped_by_relay == 0, after
        wait_for(lambda: celery_app.AsyncResult(revoked.id).state == "REVOKED", timeout=10,
                 message="the worker to discard the revoked copy")
    assert celery_app.recorder.of("revoked") == []
