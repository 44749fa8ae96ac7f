"""Adoption on the simulator: a worker's process dying at each step of an adoption, the drain, a real worker."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable, Iterator

import pytest
from celery import Celery
from helpers import wait_for
from kombu import Connection, Consumer, Queue

from celery_ladder.adoption import ADOPTED_HEADER, COUNTS
from celery_ladder.adoption.drain import drain
from celery_ladder.adoption.transfer import Mover
from celery_ladder.adoption.worker import Adopter, Gate
from celery_ladder.settings import LadderSettings
from kombu_ladder.contract import rung_names
from kombu_ladder.relay import Relay
from kombu_ladder.simulator import SimulatedBroker

QUEUE = "tasks"
#: How far ahead the adopted task is due (the simulator's virtual seconds).
AHEAD = 600


@pytest.fixture
def broker() -> Iterator[SimulatedBroker]:
    broker = SimulatedBroker()
    broker.host(Relay())
    yield broker
    broker.close()


def plain_app(broker: SimulatedBroker) -> Celery:
    """A Celery app without the ladder: its ETA tasks go straight to their queue."""
    app = Celery("plain", broker=broker.url, set_as_current=False)
    app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)
    return app


def send(broker: SimulatedBroker, *etas: float, plain: int = 0) -> list[str]:
    """Send a task per ETA (seconds from the virtual now), then ``plain`` tasks without one; return their ids."""
    app = plain_app(broker)
    try:
        ids = [app.send_task("t.work", eta=broker.datetime() + timedelta(seconds=s)).id for s in etas]
        return ids + [app.send_task("t.work").id for _ in range(plain)]
    finally:
        app.close()


def in_ladder(broker: SimulatedBroker) -> int:
    return sum(len(broker.messages(rung)) for rung in rung_names())


class Worker:
    """What a worker process does with task messages, minus Celery: a consumer, the gate, the adoption thread.

    ``ran`` lists the ids the task strategy (Celery, in a real worker) was given. The
    consumer's thread (the test's) runs what the adoption thread asks it to (``call_soon``).
    """

    def __init__(self, broker: SimulatedBroker) -> None:
        self.broker = broker
        self.ran: list[str] = []
        #: Originals this worker acked for the adoption thread (adopted, or dropped as adopted already).
        self.acked: list[str] = []
        self.pending: list[Callable[[], Any]] = []
        self.lock = threading.Lock()
        self.dead = False
        self.connection = broker.connection()
        settings = LadderSettings(adopt=True)
        self.adopter = Adopter(self.connection.clone(), settings=settings, clock=broker.now,
                               call_soon=self._call_soon)
        self.gate = Gate(self.adopter, clock=broker.now, timezone=lambda: None, revoked=set())
        self.strategy = self.gate.wrap(self._celery)
        self.consumer = Consumer(self.connection, [Queue(QUEUE)], on_message=self._on_message, prefetch_count=10)
        self.consumer.consume()
        self.adopter.start()

    def _call_soon(self, function: Callable[[], Any]) -> None:
        with self.lock:
            self.pending.append(function)

    def _celery(self, message: Any, body: Any, ack: Any, reject: Any, callbacks: Any = None) -> None:
        assert ADOPTED_HEADER not in message.headers, "Celery never sees the adoption header"
        self.ran.append(message.headers["id"])
        message.ack()

    def _on_message(self, message: Any) -> None:
        def ack(*args: Any) -> None:
            self.acked.append(message.headers["id"])
            message.ack()

        self.strategy(message, None, ack, None, None)

    def turn(self) -> None:
        """One turn of the consumer's loop: read what arrived, run what the adoption thread asked for."""
        if self.dead:
            return
        try:
            self.connection.drain_events(timeout=0.05)
        except TimeoutError:
            pass
        with self.lock:
            pending, self.pending = self.pending, []
        for function in pending:
            function()

    def until(self, condition: Callable[[], Any], message: str) -> None:
        def turned() -> Any:
            self.turn()
            return condition()

        wait_for(turned, timeout=10, interval=0.01, message=message)

    def die(self) -> None:
        """What kill -9 does to a worker: its connections drop, whatever it was doing; nothing else runs."""
        self.dead = True
        self.adopter._stopping.set()
        self.connection.close()
        self.adopter.connection.close()

    def stop(self) -> None:
        self.adopter.stop()
        self.connection.close()


class Killed(Exception):
    """The worker process is gone."""


#: Where the worker dies, and how: a patch of the adoption's transaction.
POINTS = ("before-stage", "before-commit", "after-commit", "after-ack")


@pytest.mark.parametrize("point", POINTS)
def test_a_worker_dying_at_any_step_of_an_adoption_leaves_exactly_one_copy(
        broker: SimulatedBroker, point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (task,) = send(broker, AHEAD)
    first = Worker(broker)
    stage, commit = Mover.stage, Mover.commit

    def dying(real: Callable[..., Any], before: bool) -> Callable[..., Any]:
        def patched(self: Mover, *args: Any) -> Any:
            if before:
                first.die()
                raise Killed(point)
            real(self, *args)
            first.die()
            raise Killed(point)
        return patched

    if point == "before-stage":
        monkeypatch.setattr(Mover, "stage", dying(stage, before=True))
    elif point == "before-commit":
        monkeypatch.setattr(Mover, "commit", dying(commit, before=True))
    elif point == "after-commit":
        monkeypatch.setattr(Mover, "commit", dying(commit, before=False))
    adopted = COUNTS.adopted
    if point == "after-ack":
        first.until(lambda: COUNTS.adopted > adopted and not broker.depth(QUEUE) and not first.pending,
                    "the adoption and the ack of the original")
        first.die()
    else:
        first.until(lambda: first.dead, f"the worker to die {point}")
    first.adopter.stop()
    monkeypatch.undo()
    committed = point in ("after-commit", "after-ack")
    assert in_ladder(broker) == (1 if committed else 0)
    assert broker.depth(QUEUE) == (0 if point == "after-ack" else 1), "an original not acked comes back"

    second = Worker(broker)  # the worker restarted: the original, redelivered, is looked up first
    dropped = COUNTS.originals_dropped
    try:
        if point != "after-ack":
            second.until(lambda: second.acked, "the redelivered original to be settled")
        assert not broker.depth(QUEUE) and in_ladder(broker) == 1
        assert COUNTS.originals_dropped - dropped == (1 if point == "after-commit" else 0)
        broker.advance(AHEAD + 1)
        second.until(lambda: second.ran, "the copy to be delivered and run")
        broker.advance(60)
        for _ in range(20):
            second.turn()
    finally:
        second.stop()
    assert second.ran == [task] and first.ran == [], "the task runs once, at its ETA"
    assert in_ladder(broker) == 0 and broker.depth(QUEUE) == 0


def test_an_adopted_copy_is_never_adopted_again_even_when_it_arrives_early(broker: SimulatedBroker) -> None:
    """A relay of another clock delivers a copy early: the worker holds it, as Celery does; no loop."""
    (task,) = send(broker, AHEAD)
    worker = Worker(broker)
    try:
        worker.until(lambda: in_ladder(broker) == 1 and not broker.depth(QUEUE), "the adoption")
        copy = broker.take(rung_names()[1])[0]  # out of the ladder before its time, as a skewed relay would
        with Connection(broker.url) as conn:
            conn.Producer().publish(copy.body, routing_key=QUEUE, headers=copy.headers,
                                    content_type=copy.content_type, content_encoding=copy.content_encoding,
                                    serializer=None)
        worker.until(lambda: worker.ran, "the early copy to go to Celery")
    finally:
        worker.stop()
    assert worker.ran == [task] and in_ladder(broker) == 0


def test_drain_moves_the_eta_tasks_and_leaves_the_others_in_order(broker: SimulatedBroker) -> None:
    far = send(broker, AHEAD, 2 * AHEAD)
    plain = send(broker, plain=3)
    soon = send(broker, 5)  # within the hold window: left for a worker to hold
    more = send(broker, 3 * AHEAD)
    settings = LadderSettings()
    with broker.connection() as conn:
        dry = drain(conn, QUEUE, settings=settings, dry_run=True)
        assert (dry.looked_at, dry.adopted, dry.no_eta, dry.due_soon) == (7, 3, 3, 1)
        assert [m.headers["id"] for m in broker.messages(QUEUE)] == far + plain + soon + more, "a dry run moves nothing"
        assert in_ladder(broker) == 0
        done = drain(conn, QUEUE, settings=settings)
    assert (done.looked_at, done.adopted, done.left, done.dry_run) == (7, 3, 4, False)
    assert [m.headers["id"] for m in broker.messages(QUEUE)] == plain + soon, "the others stay, in their order"
    assert in_ladder(broker) == 3
    broker.take(QUEUE)
    broker.advance(3 * AHEAD + 1)
    delivered = broker.messages(QUEUE)
    assert sorted(m.headers["id"] for m in delivered) == sorted(far + more)
    assert all(m.headers[ADOPTED_HEADER] == m.headers["eta"] for m in delivered)


def test_drain_limit_and_a_missing_queue(broker: SimulatedBroker) -> None:
    send(broker, AHEAD, AHEAD, AHEAD)
    with broker.connection() as conn:
        assert drain(conn, QUEUE, settings=LadderSettings(), limit=2).adopted == 2
        assert broker.depth(QUEUE) == 1
        with pytest.raises(LookupError, match="queue 'nope' does not exist"):
            drain(conn, "nope", settings=LadderSettings())
        with pytest.raises(ValueError, match="limit"):
            drain(conn, QUEUE, settings=LadderSettings(), limit=0)


@pytest.fixture
def celery_config() -> dict[str, Any]:
    """The embedded worker adopts: it does not run a relay of its own (the simulator's relays)."""
    return {"ladder_adopt": True, "task_default_queue": QUEUE}


def test_an_embedded_worker_adopts_a_plain_apps_eta_task_and_runs_it_at_its_eta(
        celery_app: Any, celery_worker: Any, ladder_celery: Any) -> None:
    @celery_app.task(name="t.work", shared=False)
    def work() -> str:
        return "done"

    celery_worker.reload()  # the task was defined after the worker started
    broker = ladder_celery.broker
    assert celery_worker.consumer.ladder_adopt is not None, "ladder_adopt=True adds the step"
    adopted = COUNTS.adopted
    (task,) = send(broker, AHEAD)
    wait_for(lambda: in_ladder(broker) == 1 and COUNTS.adopted == adopted + 1, timeout=10,
             message="the worker to adopt the task")
    assert celery_app.control.inspect(timeout=1).scheduled() in (None, {celery_worker.hostname: []})
    result = celery_app.AsyncResult(task)
    ladder_celery.advance(AHEAD - 1)
    assert result.state == "PENDING"
    ladder_celery.advance(2)
    assert result.get(timeout=10) == "done"


def test_a_worker_whose_user_may_not_adopt_holds_the_task_as_celery_does(
        broker: SimulatedBroker, caplog: pytest.LogCaptureFixture) -> None:
    """Without the adopter's permissions (kombu_ladder.permissions.adopter: write on the exchange of adoption
    records) nothing moves, and it says so once."""
    broker.set_permissions(write=r"^(?!ladder\.record\.adopted$).*")
    tasks = send(broker, AHEAD, AHEAD + 1)
    worker = Worker(broker)
    try:
        worker.until(lambda: len(worker.ran) == 2, "both tasks to go to Celery")
    finally:
        worker.stop()
    assert worker.ran == tasks and in_ladder(broker) == 0
    refused = [r for r in caplog.records if "refuses what adoption needs" in r.getMessage()]
    assert len(refused) == 1 and "ACCESS_REFUSED" in refused[0].getMessage()
