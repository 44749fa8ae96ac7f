"""pytest fixtures for Celery projects: ``ladder_celery``, a Celery app on the simulator with the ladder installed.

It composes with celery.contrib.pytest (which pytest-celery loads): in a test that also
asks for ``celery_app`` it puts that app on the simulator, and an embedded ``celery_worker``
then consumes from the simulator and runs each task once :meth:`LadderCelery.advance` made
it due (see :func:`ladder_celery`).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Callable, Generator, Iterator, NamedTuple, Optional

import pytest
from celery import Celery, current_app
from celery.utils.time import maybe_iso8601, maybe_make_aware
from celery.worker.request import Request
from celery.worker.strategy import default as default_strategy

from kombu_ladder.link import clock_of
from kombu_ladder.pytest_plugin import simulated_rabbitmq
from kombu_ladder.relay import Relay
from kombu_ladder.simulator import SimulatedBroker

from . import install

__all__ = ["LadderCelery", "TaskMessage", "ladder_celery", "ladder_celery_app"]


class TaskMessage(NamedTuple):
    """A task message that reached a queue (Celery task protocol 2)."""

    name: str
    id: str
    args: list[Any]
    kwargs: dict[str, Any]
    eta: Optional[str]
    headers: dict[str, Any]
    #: The kombu message itself.
    message: Any


def _task_message(message: Any) -> TaskMessage:
    headers = dict(message.headers or {})
    if "task" not in headers or "id" not in headers:
        raise ValueError(f"not a Celery task message (protocol 2 headers task and id are missing): {headers!r}")
    args, kwargs, _embed = message.decode()
    return TaskMessage(headers["task"], headers["id"], list(args), dict(kwargs), headers.get("eta"), headers, message)


class LadderCelery:
    """A Celery app on a :class:`~kombu_ladder.simulator.SimulatedBroker`, with the ladder installed.

    ``apply_async(countdown=...)`` goes into the simulated ladder; :meth:`advance`
    moves the virtual clock and runs the relay; :meth:`delivered` shows the task
    messages that reached a queue and :meth:`run_delivered` executes them.
    """

    def __init__(self, app: Celery, broker: SimulatedBroker) -> None:
        #: The Celery app (the one :func:`ladder_celery_app` gave).
        self.app = app
        #: The simulated broker under it.
        self.broker = broker
        #: Task messages :meth:`run_delivered` did not run because their ``expires`` had passed.
        self.expired: list[TaskMessage] = []

    def _has_expired(self, task: TaskMessage) -> bool:
        expires = task.headers.get("expires")
        if not expires:
            return False
        return maybe_make_aware(maybe_iso8601(expires), self.app.timezone) < self.broker.datetime()

    def now(self) -> float:
        """Return the virtual time in epoch seconds."""
        return self.broker.now()

    def advance(self, seconds: float) -> None:
        """Move the virtual clock forward; due tasks hop through the ladder and reach their queue."""
        self.broker.advance(seconds)

    def _queues(self, queue: Optional[str]) -> list[str]:
        if queue is not None:
            return [queue]
        names = {q.name for q in self.app.amqp.queues.values()} | {self.app.conf.task_default_queue}
        return sorted(names)

    def delivered(self, queue: Optional[str] = None) -> list[TaskMessage]:
        """Return the task messages waiting in ``queue`` (default: every queue the app knows), oldest first."""
        return [_task_message(m) for name in self._queues(queue) for m in self.broker.messages(name)]

    def run_delivered(self, queue: Optional[str] = None, *, as_worker: bool = False) -> list[Any]:
        """Take the task messages waiting in ``queue`` (default: all the app's queues) and run them.

        Each task runs in this process with its real arguments. By default it
        runs through :meth:`celery.Task.apply`, Celery's eager path: a
        ``retry()`` runs again at once. With ``as_worker=True`` it runs as a
        worker runs it (Celery's own ``Request.execute``): a ``retry(countdown=)``
        or a linked callback is published to the simulator, through the ladder.

        A task whose ``expires`` has passed on the virtual clock is not run, as
        a worker revokes it; it is added to :attr:`expired` instead.

        Returns:
            Eager: each task's :class:`celery.result.EagerResult`. As a worker:
            each task's return value (a :class:`billiard.einfo.ExceptionInfo`
            when it failed or retried).
        """
        results = []
        for name in self._queues(queue):
            for message in self.broker.take(name):
                task = _task_message(message)
                if self._has_expired(task):
                    self.expired.append(task)
                    continue
                if as_worker:
                    results.append(Request(message, on_ack=_no_op, on_reject=_no_op, app=self.app,
                                           hostname="ladder-simulator").execute())
                    continue
                results.append(self.app.tasks[task.name].apply(
                    args=task.args, kwargs=task.kwargs, task_id=task.id, retries=task.headers.get("retries", 0)))
        return results


def _no_op(*args: Any, **kwargs: Any) -> None:
    """The taken message is already off the queue: there is nothing to ack or reject."""


@pytest.fixture
def ladder_celery_app() -> Iterator[Celery]:
    """The Celery app ``ladder_celery`` puts on the simulator; override it to test your project's app."""
    previous = current_app._get_current_object()
    app = Celery("ladder-test", set_as_current=True)
    app.conf.task_default_queue = "celery"
    try:
        yield app
    finally:
        previous.set_current()


@pytest.fixture
def ladder_celery(request: pytest.FixtureRequest) -> Iterator[LadderCelery]:
    """A Celery app on an in-memory broker with a virtual clock, the ladder installed and a relay running.

    .. code-block:: python

        def test_reminder(ladder_celery):
            send_reminder.apply_async((7,), countdown=4 * 3600)
            ladder_celery.advance(4 * 3600)
            assert [t.args for t in ladder_celery.delivered()] == [[7]]
            ladder_celery.run_delivered()

    The app is ``ladder_celery_app``'s, or celery.contrib.pytest's ``celery_app`` when
    the test asks for that too. Then an embedded ``celery_worker`` consumes from the
    simulator (it starts after this fixture) and runs each task once ``advance()`` made
    it due: the simulator's relay delivers it, and the worker counts its ETA on the
    virtual clock, so it waits for no wall-clock time.
    """
    with_worker = "celery_app" in request.fixturenames
    app = request.getfixturevalue("celery_app" if with_worker else "ladder_celery_app")
    broker = SimulatedBroker(rabbitmq=simulated_rabbitmq(request.config))
    keys = ("broker_url", "broker_read_url", "broker_write_url", "ladder_relay")
    saved = {key: app.conf.get(key) for key in keys}
    app.conf.update(broker_url=broker.url, broker_read_url=None, broker_write_url=None,
                    ladder_relay=False)  # the simulator's relay below relays, in advance()
    _reset_pool(app)
    install(app)
    producer_class, task_class = app.amqp.Producer, app.Task
    had_clock, had_strategy = "clock" in producer_class.__dict__, "Strategy" in task_class.__dict__
    producer_class.clock = staticmethod(broker.now)
    task_class.Strategy = STRATEGY  # for a worker started from now on
    app.now = lambda: _virtual_now(app, broker)  # Celery turns countdown into eta with app.now()
    broker.host(Relay())
    try:
        yield LadderCelery(app, broker)
    finally:
        del app.now
        if not had_strategy:
            del task_class.Strategy
        if not had_clock:
            del producer_class.clock
        _reset_pool(app)
        app.conf.update(saved)
        broker.close()


#: The task strategy (as Celery names one) of a ``ladder_celery`` app: see :func:`virtual_clock_strategy`.
STRATEGY = f"{__name__}:virtual_clock_strategy"


#: Celery's own test fixtures (``celery_app``, ``celery_worker``, ``celery_config``...), which ``ladder_celery``
#: composes with.
CELERY_FIXTURES = "celery.contrib.pytest"

#: The plugin name under which pytest-celery registers them (its pytest11 entry point).
PYTEST_CELERY = "celery"


def pytest_configure(config: pytest.Config) -> None:
    """Load Celery's test fixtures unless pytest-celery (or ``-p celery.contrib.pytest``) did, so that a test
    can ask for ``celery_app`` and ``celery_worker`` beside ``ladder_celery`` with no set-up of its own."""
    manager = config.pluginmanager
    if not (manager.has_plugin(CELERY_FIXTURES) or manager.has_plugin(PYTEST_CELERY)
            or manager.is_blocked(CELERY_FIXTURES)):
        import celery.contrib.pytest as fixtures  # registered, not imported by name: no assertion rewriting

        manager.register(fixtures, CELERY_FIXTURES)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """In a test that asks for both, ``celery_worker`` starts after ``ladder_celery``: on the simulator."""
    if fixturedef.argname == "celery_worker" and "ladder_celery" in request.fixturenames:
        request.getfixturevalue("ladder_celery")
    yield


def virtual_clock_strategy(task: Any, app: Celery, consumer: Any, **kwargs: Any) -> Any:
    """Celery's default task strategy, counting a task's ETA on the simulator's clock.

    A worker holds a task with an ETA in its timer until that time comes on the
    wall clock; on the simulator the ETA is virtual, and the relay delivered the task
    when it fell due in virtual time. The timer is given the ETA moved by the
    distance between the two clocks at that moment.
    """
    return default_strategy(task, app, _VirtualTimer(consumer, clock_of(consumer.connection)), **kwargs)


class _VirtualTimer:
    """The worker's consumer as Celery's strategy sees it, its ``timer.call_at`` on the virtual clock."""

    def __init__(self, consumer: Any, clock: Callable[[], float]) -> None:
        self._consumer, self._clock = consumer, clock
        self.timer = self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def call_at(self, eta: float, fun: Any, args: Any = (), kwargs: Any = None, priority: int = 0) -> Any:
        return self._consumer.timer.call_at(eta - (self._clock() - time.time()), fun, args, kwargs, priority)


def _virtual_now(app: Celery, broker: SimulatedBroker) -> datetime:
    return broker.datetime().astimezone(app.timezone)


def _reset_pool(app: Celery) -> None:
    """Drop the app's cached connection and producer pools so the next publish uses the current broker_url."""
    pool = app.__dict__.get("_pool") or getattr(app, "_pool", None)
    if pool is not None:
        pool.force_close_all()
        app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None and getattr(amqp, "_producer_pool", None) is not None:
        amqp._producer_pool.force_close_all()
        amqp._producer_pool = None
