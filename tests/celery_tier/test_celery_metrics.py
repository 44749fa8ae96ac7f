"""A ``-P ladder`` worker with ``ladder_metrics_port`` serves the relay's metrics from its main process."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import celery_ladder_cli, purge_ladder, vhost_url, wait_for
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

import celery_ladder
from celery_ladder.settings import LadderSettings
from kombu_ladder.cancellation.records import STREAM
from kombu_ladder.depths import LADDER_QUEUES
from kombu_ladder.metrics import METRIC_NAMES

from .poolapp import POOL_QUEUE, make_app
from .recording import purge_queues
from .test_celery_pool_cli import Worker


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - a local test URL
            text = answer.read().decode()
    except OSError:
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.broker
@pytest.mark.celery
def test_a_pool_ladder_worker_serves_the_metrics(broker_url: str, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    monkeypatch.setenv("LADDER_POOL_METRICS_PORT", str(port))
    with Connection(broker_url) as conn:
        purge_ladder(conn)
    purge_queues(broker_url, (POOL_QUEUE,))
    publisher = celery_ladder.install(make_app(broker_url))
    worker = Worker(broker_url, tmp_path)
    try:
        def served() -> dict[Any, float]:
            assert worker.proc.poll() is None, worker.output()
            return scrape(url)

        before = wait_for(served, 60, interval=0.2, message="the worker's /metrics")
        assert isinstance(before, dict)
        names = {name for name, _ in before}
        for name in METRIC_NAMES:
            assert name in names or f"{name}_bucket" in names, name
        assert ("ladder_scheduled_total", ()) in before
        assert before[("ladder_cancellations_enforced", ())] == 1
        assert {dict(labels)["queue"] for name, labels in before if name == "ladder_queue_messages"} == \
            set(LADDER_QUEUES)
        when = publisher.tasks["poolapp.when"]
        results = [when.apply_async(countdown=1.5 + i * 0.2, queue=POOL_QUEUE) for i in range(5)]
        for result in results:
            result.get(timeout=30)
        delivered = ("ladder_delivered_total", ())
        inf = ("ladder_delivery_lateness_seconds_bucket", (("le", "+Inf"),))
        after = wait_for(lambda: (lambda now: now if now.get(delivered, 0) - before[delivered] >= 5 else {})(
            scrape(url)), 10, message="five deliveries counted")
        assert isinstance(after, dict)
        assert after[delivered] - before[delivered] == 5 and after[inf] - before[inf] == 5
    finally:
        code = worker.stop()
        publisher.close()
    assert code == 0, worker.output()
    assert "Traceback" not in worker.output()


@pytest.mark.broker
@pytest.mark.celery
def test_a_worker_whose_relay_cannot_read_the_stream_says_so_in_its_metric_and_status(
        fresh_vhost: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """ladder.cancellations declared first as a classic queue: the worker relays, unenforced, and says so."""
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        conn.default_channel.queue_declare(STREAM, durable=True, auto_delete=False)
    port = free_port()
    monkeypatch.setenv("LADDER_POOL_METRICS_PORT", str(port))
    worker = Worker(url, tmp_path)
    try:
        def served() -> dict[Any, float]:
            assert worker.proc.poll() is None, worker.output()
            return scrape(f"http://127.0.0.1:{port}/metrics")

        assert wait_for(served, 60, interval=0.2, message="the worker's /metrics")[
            ("ladder_cancellations_enforced", ())] == 0
        status = celery_ladder_cli(url, "status", "--timeout", "5")
        assert status.returncode == 0, status.stderr
        assert "cancellations: PROBLEM: ladder.cancellations is not the cancellation stream" in status.stdout
        row = next(line for line in status.stdout.splitlines() if line.startswith(worker.hostname))
        assert row.split()[1:3] == ["yes", "NO"], status.stdout
        assert f"the relay of {worker.hostname} does NOT enforce cancellations" in status.stdout
    finally:
        code = worker.stop()
    assert code == 0, worker.output()


@pytest.mark.parametrize("given,expected", [(None, None), (9808, 9808), ("9808", 9808), (0, 0)])
def test_the_metrics_port_setting(given: Any, expected: Any) -> None:
    assert LadderSettings.from_conf({"ladder_metrics_port": given}).metrics_port == expected


@pytest.mark.parametrize("given", [-1, 65536, "http", True, 98.1])
def test_a_bad_metrics_port_names_the_setting(given: Any) -> None:
    with pytest.raises(ValueError, match="ladder_metrics_port \\(CELERY_LADDER_METRICS_PORT in Django settings\\)"):
        LadderSettings.from_conf({"ladder_metrics_port": given})


def test_a_bad_metrics_address_names_the_setting() -> None:
    assert LadderSettings.from_conf({}).metrics_address == "127.0.0.1"
    assert LadderSettings.from_conf({"ladder_metrics_address": "0.0.0.0"}).metrics_address == "0.0.0.0"
    with pytest.raises(TypeError, match="ladder_metrics_address \\(CELERY_LADDER_METRICS_ADDRESS"):
        LadderSettings.from_conf({"ladder_metrics_address": 8080})
