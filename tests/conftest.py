"""Shared fixtures: a private RabbitMQ vhost per test session, and helpers to wait on conditions."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator
from urllib.parse import quote

import pytest
from kombu import Connection

from kombu_ladder.contract import CONTROL, PARKING, rung_names

BROKER_HOST = os.environ.get("LADDER_TEST_HOST", "127.0.0.1")
BROKER_PORT = int(os.environ.get("LADDER_TEST_PORT", "5672"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


#: Fixtures that reach the real RabbitMQ: a test that uses one, directly or through another, is a broker test.
BROKER_FIXTURES = frozenset({"rabbit_vhost", "broker_url", "connection"})


@pytest.hookimpl(tryfirst=True)  # before -m selects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tiers: ``broker`` on every test that reaches RabbitMQ, ``unit`` on what needs no broker,
    no Celery worker and no process of its own (``make test-unit``)."""
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
        if not any(item.get_closest_marker(tier) for tier in ("broker", "celery", "process")):
            item.add_marker(pytest.mark.unit)


def broker_reachable() -> bool:
    try:
        with socket.create_connection((BROKER_HOST, BROKER_PORT), timeout=2):
            return True
    except OSError:
        return False


def require_broker() -> None:
    """Skip locally, but fail under CI=true, when RabbitMQ is unreachable."""
    if broker_reachable():
        return
    message = f"RabbitMQ is not reachable at {BROKER_HOST}:{BROKER_PORT}"
    if IN_CI:
        pytest.fail(message + " (CI=true: broker-tier tests must not skip)", pytrace=False)
    pytest.skip(message)


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


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


@contextmanager
def temporary_vhost(vhost: str) -> Iterator[str]:
    """Create ``vhost`` with full permissions for guest; delete it afterwards."""
    _rabbitmqctl("add_vhost", vhost)
    _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        yield vhost
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def broker_url(rabbit_vhost: str) -> str:
    """The AMQP URL of this session's vhost."""
    return f"amqp://guest:guest@{BROKER_HOST}:{BROKER_PORT}/{quote(rabbit_vhost, safe='')}"


@pytest.fixture
def connection(broker_url: str) -> Iterator[Connection]:
    """A kombu connection to the session vhost, with the ladder queues emptied first."""
    with Connection(broker_url) as conn:
        conn.ensure_connection(max_retries=3)
        purge_ladder(conn)
        yield conn


def purge_ladder(conn: Connection) -> None:
    """Empty every ladder queue that exists, so one test's leftovers never reach another."""
    purge(conn, *rung_names(), CONTROL, PARKING)


def purge(conn: Connection, *queues: str) -> None:
    """Empty each of ``queues`` that exists (a missing one is fine)."""
    for name in queues:
        channel = conn.channel()
        try:
            channel.queue_purge(name)
        except conn.channel_errors:
            pass
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - closed by the broker on a missing queue
                pass


def wait_for(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.05,
             message: str = "condition") -> object:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(interval)


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
