"""The quickstarts' code (examples/, included verbatim in the docs) runs and does what the docs say."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Iterator

import pytest
from helpers import ladder_counters, purge, vhost_url, wait_for
from kombu import Connection

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

pytestmark = pytest.mark.broker


def load(name: str, **env: str) -> types.ModuleType:
    """Import ``examples/<name>.py`` as a fresh module (with ``env`` set while it imports)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")  # task names follow it
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return module


def test_kombu_scheduler_example_delivers_short_delays_before_a_long_one(
    connection: Connection, broker_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    purge(connection, "reminders")
    arrived = load("kombu_scheduler").main(broker_url)
    # Published 8 s first, then 1 s and 4 s: the short ones overtake it.
    assert arrived == ["one second", "four seconds", "eight seconds"]
    out = capsys.readouterr().out
    assert "Scheduler{rungs=1h, 10m, 1m, 10s, 1s, scheduled=3, delivered=3}" in out


def test_kombu_producer_example_delivers_in_due_order_with_json_intact(
    connection: Connection, broker_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    purge(connection, "invoices")
    arrived = load("kombu_producer").main(broker_url)
    # 44 had no delay, 43 an eta 2 s ahead, 42 a countdown of 5 s.
    assert arrived == [{"invoice": 44}, {"invoice": 43}, {"invoice": 42}]
    assert capsys.readouterr().out.count("application/json") == 3


# -- Celery ------------------------------------------------------------------


@pytest.fixture
def celery_worker_process(fresh_vhost: str) -> Iterator[tuple[str, Any]]:
    """``celery -A celery_app worker -P ladder`` on a vhost of its own; yields (url, app)."""
    url = vhost_url(fresh_vhost)
    env = dict(os.environ, BROKER_URL=url, PYTHONPATH=os.pathsep.join([str(ROOT), str(EXAMPLES)]))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", "ladder", "-c", "1",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "examples@%h",
         "--loglevel=INFO"],
        cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    module = load("celery_app", BROKER_URL=url)
    app = module.app
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                worker.kill()
                pytest.fail("the example worker did not start:\n" + (worker.communicate()[0] or "")[-3000:])
        yield url, module
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        app.close()


@pytest.mark.celery
def test_celery_example_runs_a_countdown_task_through_the_ladder(
    celery_worker_process: tuple[str, Any],
) -> None:
    _, module = celery_worker_process
    sent = time.time()
    result = module.remind.apply_async(("pay the invoice",), countdown=3)
    assert result.get(timeout=60) == "reminded: pay the invoice"
    # Not run early (the relay delivers at the due time; a foreign AceMQ relay up to 1 s early, which the worker holds).
    assert time.time() - sent >= 3 - 1.0
    # And it really went through the worker's relay (-P ladder), not the worker's ETA timer.
    # a delivery is counted once confirmed, which may come a moment after the task ran
    def answered() -> dict[str, Any]:
        counters = ladder_counters(module.app)
        return counters if any(report.get("delivered", 0) >= 1 for report in counters.values()) else {}

    counters = wait_for(answered, timeout=30, interval=0.2, message="the worker to answer 'inspect ladder'")
    (report,) = counters.values()
    assert report["relay"] is True
    assert report["delivered"] >= 1


# -- Django ------------------------------------------------------------------

DJANGO_PROJECT = EXAMPLES / "django_project"


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the example project's ``manage.py`` in a process of its own."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    full_env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=DJANGO_PROJECT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def ready_messages(url: str, queue: str) -> int:
    with Connection(url) as conn:
        channel = conn.channel()
        try:
            _, messages, _ = channel.queue_declare(queue, passive=True)
            return int(messages)
        except conn.channel_errors:
            return 0
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - closed by the broker on a missing queue
                pass


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_django_example_toggle_decides_whether_a_countdown_task_waits_in_the_ladder(
    fresh_vhost: str, enabled: str,
) -> None:
    url = vhost_url(fresh_vhost)
    done = manage("remind", "hello", "--countdown", "300", BROKER_URL=url, LADDER_ENABLED=enabled)
    assert done.returncode == 0, done.stderr
    assert "scheduled " in done.stdout
    # 300 s goes into the 1-minute rung (hops_for(300) starts with 60), where it waits 60 s.
    in_ladder, in_task_queue = ready_messages(url, "acemq.schedule.1m"), ready_messages(url, "quickstart-django")
    if enabled == "true":
        assert (in_ladder, in_task_queue) == (1, 0)
    else:  # Celery's own path: straight to the task queue, where a worker would hold it
        assert (in_ladder, in_task_queue) == (0, 1)


def test_django_example_refuses_to_start_with_a_bad_toggle_value() -> None:
    done = manage("check", LADDER_ENABLED="maybe", BROKER_URL="amqp://guest:guest@127.0.0.1:1//")
    assert done.returncode != 0
    assert "CELERY_LADDER_ENABLED" in done.stderr
    assert "'maybe'" in done.stderr


# -- make demo -----------------------------------------------------------------


def demo(broker: str) -> subprocess.CompletedProcess[str]:
    """``python examples/demo.py`` (what ``make demo`` runs) with ``LADDER_DEMO_BROKER`` set to ``broker``."""
    return subprocess.run([sys.executable, str(EXAMPLES / "demo.py")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LADDER_DEMO_BROKER": broker, "PYTHONPATH": str(ROOT)})


@pytest.mark.process
def test_make_demo_without_a_broker_runs_on_the_simulator() -> None:
    done = demo("amqp://guest:guest@127.0.0.1:1//")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no RabbitMQ at amqp://guest:guest@127.0.0.1:1// (")
    assert "running the same scenario on the in-memory simulator" in done.stdout
    assert "arrival order: 2s, 5s, 12s, 65s (published 65s, 12s, 5s, 2s)" in done.stdout


@pytest.mark.parametrize("wrong,reason", [("password", "ACCESS_REFUSED"), ("vhost", "NOT_ALLOWED")])
def test_make_demo_stops_when_the_broker_refuses_it(broker_url: str, wrong: str, reason: str) -> None:
    """A broker that answers and refuses is an error to fix, not a reason to fall back to the simulator."""
    url = (broker_url.replace("guest:guest@", "guest:not-the-password@") if wrong == "password"
           else broker_url.rsplit("/", 1)[0] + "/no-such-vhost-for-the-demo")
    done = demo(url)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "simulator" not in done.stdout and done.stdout == ""
    first, hint = done.stderr.strip().splitlines()
    assert first.startswith("the broker at amqp://guest:**@") and reason in first, first
    assert "not-the-password" not in done.stderr
    assert hint.startswith("Fix the URL (--broker, or $LADDER_DEMO_BROKER)")
