"""Shared fixtures and the tier marks: a private RabbitMQ vhost per session, the two ladder backends."""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import quote

import celery_rpc_polling
import pytest
from helpers import (
    BROKER_HOST,
    BROKER_PORT,
    IN_CI,
    purge_ladder,
    rabbitmqctl,
    require_broker,
    temporary_vhost,
    vhost_url,
)
from hostile_corpus import WRITE_PERMISSION
from hypothesis import settings
from kombu import Connection

from kombu_ladder.permissions import Permissions
from kombu_ladder.simulator import registry as simulator_registry

# Property tests assert what happens, not how fast: on a shared two-core machine (CI runs its lanes
# at once) one example of a year's delay, 8,800 hops, can take longer than Hypothesis's 200 ms default.
settings.register_profile("ladder", deadline=None)
settings.load_profile("ladder")
# The simulator names its brokers sim-1, sim-2... in each process, and the CLI keeps an index file per broker URL
# under ~/.cache: two test processes at once (make test's xdist workers, another checkout's run) would share
# sim-1's file. Numbered from the pid instead, each process's names are its own.
simulator_registry._ids = itertools.count(os.getpid() * 10_000 + 1)
# Celery 5.6's rpc result client reconnects on each quiet poll and can drop a result meanwhile (see the module).
celery_rpc_polling.apply()

#: Fixtures that reach the real RabbitMQ: a test that uses one, directly or through another, is a broker test.
BROKER_FIXTURES = frozenset({"rabbit_vhost", "broker_url", "connection"})
TESTS = Path(__file__).resolve().parent
#: The tiers whose every test must be ``unit``: no broker, no Celery worker (tests/README.md).
PURE_TIERS = ("unit", "sim")
#: Files ``make test`` runs in its serial pass, alone, after the parallel one (tests/README.md, "In parallel"):
#: the rolling restart duplicated when SIGTERM landed on a relay still starting on a loaded machine (NOTES, turn 4).
SERIAL = frozenset({"broker/test_quorum_rolling_restart.py"})
#: Files whose tests share something: one xdist worker runs each group, its tests in file order. The two
#: build files build the distribution from the checkout (setuptools writes build/ and *.egg-info in it); the
#: others have module-scoped fixtures (a worker, a browser, a docs build) whose later tests read what earlier
#: ones did (test_celery_pool_cli: the worker's counters after the delays test), or that are costly to repeat.
GROUPS = {"process/test_dist.py": "build", "process/test_packaging.py": "build",
          **{path: path for path in ("celery_tier/test_celery_pool_cli.py", "celery_tier/test_web_console.py",
                                     "process/test_docs_render.py")}}


@pytest.hookimpl(tryfirst=True)  # before -m selects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tiers: ``broker`` on every test that reaches RabbitMQ, ``unit`` on what needs no broker,
    no Celery worker and no process of its own (``make test-unit``). A test in tests/unit or tests/sim
    that is not ``unit`` is in the wrong directory: the run stops and names it."""
    misplaced = []
    for item in items:
        where = _relative(item)
        if where in SERIAL:
            item.add_marker(pytest.mark.serial)
        if where in GROUPS:
            item.add_marker(pytest.mark.xdist_group(GROUPS[where]))
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
        heavy = [tier for tier in ("broker", "celery", "process") if item.get_closest_marker(tier)]
        if not heavy:
            item.add_marker(pytest.mark.unit)
        elif tier_of(item) in PURE_TIERS and heavy != ["process"]:
            misplaced.append(f"{item.nodeid} is {'+'.join(heavy)}")
    if misplaced:
        raise pytest.UsageError("tests/unit and tests/sim hold no broker or Celery test; move these to "
                                "tests/broker or tests/celery_tier:\n  " + "\n  ".join(misplaced))


def _relative(item: pytest.Item) -> str:
    """The test's file under tests/, as a POSIX path ("" outside tests/)."""
    try:
        return Path(item.path).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return ""


def tier_of(item: pytest.Item) -> str:
    """The tier a test's file lives in: the first directory under tests/ ("" for tests/ itself)."""
    try:
        parts = Path(item.path).resolve().relative_to(TESTS).parts
    except ValueError:  # a test outside tests/ (a docs snippet run with the package's fixtures)
        return ""
    return parts[0] if len(parts) > 1 else ""


@pytest.fixture(scope="session")
def rabbit_vhost() -> Iterator[str]:
    """A vhost of this test session's own, so concurrent runs never share the ladder queues."""
    require_broker()
    if shutil.which("rabbitmqctl") is None:
        if IN_CI:
            pytest.fail("rabbitmqctl is needed to create the test vhost", pytrace=False)
        yield "/"
        return
    with temporary_vhost(f"ladder-test-{os.getpid()}-{uuid.uuid4().hex[:6]}") as vhost:
        yield vhost


@pytest.fixture(scope="session")
def broker_url(rabbit_vhost: str) -> str:
    """The AMQP URL of this session's vhost."""
    return vhost_url(rabbit_vhost)


@pytest.fixture
def fresh_vhost(rabbit_vhost: str) -> Iterator[str]:
    """A brand-new, empty vhost for one test (deleted afterwards)."""
    with temporary_vhost(f"{rabbit_vhost}-fresh-{uuid.uuid4().hex[:6]}") as vhost:
        yield vhost


@pytest.fixture
def make_user(fresh_vhost: str) -> Iterator[Callable[[str, Permissions], str]]:
    """Create users with exactly the given permissions on the test's vhost; return each one's AMQP URL."""
    made: list[str] = []

    def make(role: str, permissions: Permissions) -> str:
        user = f"ladder-{role}-{uuid.uuid4().hex[:6]}"
        rabbitmqctl("add_user", user, "secret")
        made.append(user)
        rabbitmqctl("set_permissions", "-p", fresh_vhost, user, *permissions.as_args())
        return f"amqp://{user}:secret@{BROKER_HOST}:{BROKER_PORT}/{quote(fresh_vhost, safe='')}"

    try:
        yield make
    finally:
        for user in made:
            rabbitmqctl("delete_user", user, check=False)


@pytest.fixture
def corpus_url(fresh_vhost: str) -> str:
    """A vhost of its own where guest may write everywhere but to the hostile corpus's forbidden exchange."""
    rabbitmqctl("set_permissions", "-p", fresh_vhost, "guest", ".*", WRITE_PERMISSION, ".*")
    return vhost_url(fresh_vhost)


@pytest.fixture
def connection(broker_url: str) -> Iterator[Connection]:
    """A kombu connection to the session vhost, with the ladder queues emptied first."""
    with Connection(broker_url) as conn:
        conn.ensure_connection(max_retries=3)
        purge_ladder(conn)
        yield conn


@pytest.fixture(params=[pytest.param("rabbitmq", marks=pytest.mark.broker), "simulator"])
def ladder_backend(request: pytest.FixtureRequest) -> Iterator[object]:
    """The broker a behaviour test runs on, with the ladder queues emptied first.

    ``rabbitmq`` is this session's vhost on the real broker, ``simulator`` a fresh
    in-memory broker on a virtual clock (see ``tests/backends.py``), behaving as the
    RabbitMQ release ``--ladder-rabbitmq`` names (3.10 by default; CI runs 4.3 too).
    """
    from backends import RabbitBackend, SimulatorBackend

    if request.param == "simulator":
        from kombu_ladder.pytest_plugin import simulated_rabbitmq

        simulated = SimulatorBackend(rabbitmq=simulated_rabbitmq(request.config))
        try:
            yield simulated
        finally:
            simulated.close()
        return

    if request.param == "rabbitmq":
        backend = RabbitBackend(request.getfixturevalue("broker_url"))
        with backend.connection() as conn:
            conn.ensure_connection(max_retries=3)
            purge_ladder(conn)
        yield backend
        return
    raise ValueError(f"unknown ladder backend {request.param!r}")
