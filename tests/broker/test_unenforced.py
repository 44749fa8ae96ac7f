"""Issue 28: a relay that cannot enforce cancellations says so: ``check`` fails, ``status`` says it, a metric shows it.

``ladder.cancellations`` declared first as something else (a classic queue, a stream that keeps its
records a second, a stream with a size limit) makes every relay refuse it and relay without dropping
cancelled messages; so does a relay whose user may not read it.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from helpers import celery_ladder_cli, rabbitmqctl, vhost_url, wait_for
from kombu import Connection
from test_metrics import relay_with_metrics, samples, scrape, served_url
from test_operate import run

from kombu_ladder import declare
from kombu_ladder.cancellation.records import STREAM
from kombu_ladder.permissions import relay

pytestmark = pytest.mark.broker

ENFORCED = ("ladder_cancellations_enforced", ())

#: What ``ladder.cancellations`` was declared as before any relay declared the stream.
POISONS = {
    "classic queue": {},
    "stream keeping records 1 s": {"x-queue-type": "stream", "x-max-age": "1s"},
    "stream of 100 kB": {"x-queue-type": "stream", "x-max-age": "11Y", "x-max-length-bytes": 100_000},
}


class MetricsRelay:
    """``kombu-ladder relay --metrics-port 0`` on a broker URL, read through its /metrics."""

    def __init__(self, url: str, log: Path) -> None:
        self.log = log
        self.proc = relay_with_metrics(url, log, "--metrics-port", "0", "--metrics-interval", "1")

    def enforced(self) -> float:
        """``ladder_cancellations_enforced`` once the relay consumes the control queue."""
        def consuming() -> Optional[dict[Any, float]]:
            assert self.proc.poll() is None, self.log.read_text()
            url = served_url(self.log)
            if not url or "ladder relay consuming" not in self.log.read_text():
                return None
            return samples(scrape(url))

        got = wait_for(consuming, 30, message="the relay consuming, and its metrics")
        return float(got[ENFORCED])

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)
        return self.log.read_text()


@pytest.fixture
def metrics_relay(tmp_path: Path) -> Iterator[Any]:
    started: list[MetricsRelay] = []

    def start(url: str) -> MetricsRelay:
        started.append(MetricsRelay(url, tmp_path / f"relay-{len(started)}.log"))
        return started[-1]

    try:
        yield start
    finally:
        for one in started:
            if one.proc.poll() is None:
                one.proc.kill()
                one.proc.wait()


@pytest.mark.parametrize("arguments", list(POISONS.values()), ids=list(POISONS))
def test_a_stream_declared_otherwise_fails_check_shows_in_status_and_zeroes_the_metric(
        fresh_vhost: str, metrics_relay: Any, arguments: dict[str, Any]) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
        conn.default_channel.queue_declare(STREAM, durable=True, auto_delete=False, arguments=arguments)
    relay_process = metrics_relay(url)
    assert relay_process.enforced() == 0
    log = relay_process.log.read_text()
    assert "relaying WITHOUT enforcing them" in log

    done = run(url, "check")
    assert done.returncode == 1, done.stdout
    (line,) = done.stderr.splitlines()
    assert "ladder.cancellations is not the cancellation stream (PRECONDITION_FAILED - inequivalent arg" in line
    assert "NO relay enforces cancellations" in line
    status = run(url, "status")
    assert status.returncode == 0, status.stderr
    assert "cancellations: PROBLEM: ladder.cancellations is not the cancellation stream" in status.stdout
    celery = celery_ladder_cli(url, "check")
    assert celery.returncode == 1 and "NO relay enforces cancellations" in celery.stderr, celery.stderr
    assert "Traceback" not in relay_process.stop()


def test_a_relay_whose_user_may_not_read_the_stream_zeroes_the_metric_and_fails_check(
        fresh_vhost: str, metrics_relay: Any) -> None:
    """A relay with its least-privilege row declares nothing of the control plane; nobody declared it, and check
    says so."""
    url = vhost_url(fresh_vhost)
    user = f"ladder-old-relay-{uuid.uuid4().hex[:6]}"
    perms = [p.replace(r"|ladder\.cancellations", "") for p in relay([""]).as_args()]
    rabbitmqctl("add_user", user, "secret")
    try:
        rabbitmqctl("set_permissions", "-p", fresh_vhost, user, *perms)
        relay_process = metrics_relay(url.replace("guest:guest", f"{user}:secret"))
        assert relay_process.enforced() == 0
        done = run(url, "check")
        assert done.returncode == 1
        assert "the control plane not declared while 1 relay(s) consume acemq.schedule.due" in done.stderr
        relay_process.stop()
    finally:
        rabbitmqctl("delete_user", user, check=False)


def test_the_stream_as_declared_passes_check_and_the_metric_is_one(fresh_vhost: str, metrics_relay: Any) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
    assert run(url, "check", "--min-relays", "0").stdout.endswith(
        "; the control plane not declared yet (run 'kombu-ladder declare')\n")
    relay_process = metrics_relay(url)
    assert relay_process.enforced() == 1
    done = run(url, "check")
    assert done.returncode == 0, done.stderr
    # a relay with full rights (guest) declares the whole control plane as it starts
    assert done.stdout.endswith("; the control plane is declared, ladder.cancellations included\n"), \
        done.stdout
    assert run(url, "declare").returncode == 0
    done = run(url, "check")
    assert done.stdout.endswith("; the control plane is declared, ladder.cancellations included\n"), \
        done.stdout
    assert "cancellations: the control plane is declared, ladder.cancellations included\n" \
        in run(url, "status").stdout
    relay_process.stop()
