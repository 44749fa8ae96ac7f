"""Prometheus metrics: reason codes and lateness buckets, the exposition, a relay serving them, a scrape storm."""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from amqp.channel import Channel as AmqpChannel
from helpers import extra_requirement, wait_for
from kombu import Connection, Queue
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kombu_ladder import LadderProducer
from kombu_ladder.depths import LADDER_QUEUES
from kombu_ladder.metrics import METRIC_NAMES, LadderCollector, MetricsServer
from kombu_ladder.observe import LATENESS_BUCKETS, REASONS, Lateness, lateness_seconds, reason_code
from kombu_ladder.relay import Counters
from kombu_ladder.sampler import QueueSampler

UNREACHABLE = "amqp://guest:guest@127.0.0.1:1//"


# -- pure ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("given,expected", [
    ("malformed: header x-schedule-due-at is missing", "malformed"),
    ("unroutable: NO_ROUTE (exchange='b', routing_key='k')", "unroutable"),
    ("refused: target exchange 'x' is not in the relay's allow-list", "refused"),
    ("refused", "other"),  # no colon: not a code
    ("other: a code of our own", "other"),
    ("Malformed: case matters", "other"),
    ("", "other"),
])
def test_a_park_reason_becomes_one_of_a_fixed_set_of_codes(given: str, expected: str) -> None:
    assert reason_code(given) == expected
    assert expected in REASONS


@pytest.mark.parametrize("seconds,bound", [
    (-0.9731, -0.5), (-0.001, -0.001), (-0.0004, 0.0), (0.0, 0.0), (0.0004, 0.001), (0.0021, 0.0025),
    (0.7, 1.0), (42.0, 60.0), (-7200.0, -3600.0), (7200.0, math.inf),
])
def test_lateness_lands_in_the_bucket_of_the_first_bound_not_below_it(seconds: float, bound: float) -> None:
    lateness = Lateness()
    lateness.observe(seconds)
    cumulative, total = lateness.snapshot()
    bounds = [*LATENESS_BUCKETS, math.inf]
    first = next(i for i, count in enumerate(cumulative) if count)
    assert bounds[first] == bound
    assert cumulative[-1] == 1 and total == pytest.approx(seconds)


def test_the_buckets_resolve_milliseconds_and_seconds_on_both_sides_of_zero() -> None:
    assert list(LATENESS_BUCKETS) == sorted(LATENESS_BUCKETS)
    assert 0.0 in LATENESS_BUCKETS
    for bound in (0.001, 0.005, 0.01, 0.1, 1.0, 10.0):
        assert bound in LATENESS_BUCKETS and -bound in LATENESS_BUCKETS


def test_lateness_is_now_minus_the_due_at_header() -> None:
    assert lateness_seconds({"x-schedule-due-at": 1_000_000}, 1_000.25) == pytest.approx(0.25)
    assert lateness_seconds({"x-schedule-due-at": "1_000_000"}, 999.5) == pytest.approx(-0.5)
    assert lateness_seconds({"x-schedule-due-at": "soon"}, 1.0) is None
    assert lateness_seconds({}, 1.0) is None and lateness_seconds(None, 1.0) is None


def test_counters_count_parks_by_code_and_malformed_ones_twice() -> None:
    counters = Counters()
    counters.count_parked("malformed: no headers")
    counters.count_parked("unroutable: NO_ROUTE")
    counters.count_parked("unroutable: NO_ROUTE")
    counters.count_delivered(-0.4)
    counters.count_delivered(None)
    assert counters.parked == 3 and counters.malformed == 1 and counters.delivered == 2
    assert counters.parked_reasons == {"malformed": 1, "unroutable": 2, "refused": 0, "other": 0}
    assert counters.lateness.count == 1


# -- the exposition ------------------------------------------------------------------------------------

def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


class FixedSampler(QueueSampler):
    def __init__(self) -> None:
        super().__init__(None)
        from kombu_ladder.depths import QueueDepth

        self.depths = tuple(QueueDepth(q, 7 if q != "acemq.schedule.parked" else None, 1) for q in LADDER_QUEUES)
        self.sampled_at = 1234.5


def test_the_exposition_reads_the_counters_as_they_are_now() -> None:
    from prometheus_client import CollectorRegistry

    counters = Counters()
    registry = CollectorRegistry()
    enforcing = [True]
    registry.register(LadderCollector(counters, FixedSampler(), extra=lambda: {"scheduled": 9},
                                      enforcing=lambda: enforcing[0]))
    counters.received = 4
    counters.hops = 3
    counters.count_delivered(-0.3)
    counters.count_delivered(0.002)
    counters.count_parked("refused: not allowed")
    got = samples(generate_latest(registry).decode())
    assert got[("ladder_received_total", ())] == 4
    assert got[("ladder_hops_total", ())] == 3
    assert got[("ladder_delivered_total", ())] == 2
    assert got[("ladder_scheduled_total", ())] == 9
    assert {labels: v for (name, labels), v in got.items() if name == "ladder_parked_total"} == {
        (("reason", "malformed"),): 0, (("reason", "unroutable"),): 0, (("reason", "refused"),): 1,
        (("reason", "other"),): 0}
    bucket = {dict(labels)["le"]: v for (name, labels), v in got.items()
              if name == "ladder_delivery_lateness_seconds_bucket"}
    assert bucket["-0.5"] == 0 and bucket["-0.25"] == 1 and bucket["0.001"] == 1 and bucket["0.0025"] == 2
    assert bucket["+Inf"] == 2
    # Negative bucket bounds: no _sum (a sum of negative observations is no counter), so no _count either.
    assert not any(name.startswith("ladder_delivery_lateness_seconds_s") for name, _ in got)
    queues = {dict(labels)["queue"]: v for (name, labels), v in got.items() if name == "ladder_queue_messages"}
    assert queues == {q: 7 for q in LADDER_QUEUES if q != "acemq.schedule.parked"}  # a missing queue: no gauge
    assert got[("ladder_queue_sampled_timestamp_seconds", ())] == 1234.5
    assert got[("ladder_cancellations_enforced", ())] == 1
    enforcing[0] = False
    assert samples(generate_latest(registry).decode())[("ladder_cancellations_enforced", ())] == 0


def test_skipped_control_records_are_exported_by_stream_kind_and_reason() -> None:
    from prometheus_client import CollectorRegistry

    from kombu_ladder.controlplane.reader import Skips

    skips = Skips()
    registry = CollectorRegistry()
    registry.register(LadderCollector(Counters(), skips=skips))
    for _ in range(3):
        skips.count("ladder.cancellations", "cancel", "exchange")
    skips.count("ladder.index", None, "malformed")
    got = {labels: v for (name, labels), v in samples(generate_latest(registry).decode()).items()
           if name == "ladder_control_records_skipped_total"}
    key = (("kind", "cancel"), ("reason", "exchange"), ("stream", "ladder.cancellations"))
    assert got[key] == 3
    assert got[(("kind", "none"), ("reason", "malformed"), ("stream", "ladder.index"))] == 1
    assert got[(("kind", "adopted"), ("reason", "unknown"), ("stream", "ladder.adoptions"))] == 0  # from zero


def test_every_declared_metric_name_is_exported() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(LadderCollector(Counters(), FixedSampler(), enforcing=lambda: True))
    exported = {s.name for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    for name in METRIC_NAMES:
        assert name in exported or f"{name}_bucket" in exported, name
    # And the other way: every family a relay serves is declared (a dashboard and the docs' table rely on it).
    full = CollectorRegistry()
    full.register(LadderCollector(Counters(), FixedSampler(), enforcing=lambda: True))
    families = {f.name + ("_total" if f.type == "counter" else "") for f in full.collect()}
    assert families == set(METRIC_NAMES)


@pytest.mark.process
def test_a_failed_sample_clears_the_depths_and_is_counted() -> None:
    sampler = QueueSampler(Connection(UNREACHABLE, connect_timeout=1))
    sampler.depths = FixedSampler().depths
    sampler.sample()
    assert sampler.depths == () and sampler.errors == 1 and sampler.samples == 0
    sampler.stop()


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval must be a positive number of seconds"):
        QueueSampler(None, interval=0)


# -- a relay serving them -------------------------------------------------------------------------------

def scrape(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - a local test URL
        assert answer.status == 200
        return str(answer.read().decode())


def relay_with_metrics(broker_url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("w") as sink:
        return subprocess.Popen([sys.executable, "-m", "kombu_ladder", "relay", "--broker", broker_url, *args],
                                stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def served_url(log: Path) -> str:
    found = re.search(r"serving the ladder's metrics on (http://\S+/metrics)", log.read_text())
    return found.group(1) if found else ""


@pytest.mark.broker
def test_a_standalone_relay_serves_every_metric_and_counts_five_deliveries(connection: Connection, broker_url: str,
                                                                           tmp_path: Path) -> None:
    log = tmp_path / "relay.log"
    started = time.monotonic()
    proc = relay_with_metrics(broker_url, log, "--metrics-port", "0", "--metrics-interval", "1")
    try:
        url = str(wait_for(lambda: served_url(log), 30, interval=0.01, message="the metrics address in the log"))
        first = scrape(url)
        print(f"\nfirst scrape answered {time.monotonic() - started:.3f} s after the relay process started")
        # The first answered scrape already has every metric, queue depths included.
        exported = {s.name for f in text_string_to_metric_families(first) for s in f.samples}
        for name in METRIC_NAMES:
            assert name in exported or f"{name}_bucket" in exported, (name, first)
        before = samples(first)
        target = Queue("t.metrics", durable=True).bind(connection.default_channel)
        target.declare()
        target.purge()
        producer = LadderProducer(connection.default_channel)
        for i in range(5):
            producer.publish(f"m{i}".encode(), exchange="", routing_key="t.metrics", countdown=1.5)

        def delivered() -> dict[Any, float]:
            now = samples(scrape(url))
            return now if now[("ladder_delivered_total", ())] - before[("ladder_delivered_total", ())] >= 5 else {}

        after = wait_for(delivered, 30, message="five deliveries in ladder_delivered_total")
        assert isinstance(after, dict)
        assert after[("ladder_delivered_total", ())] - before[("ladder_delivered_total", ())] == 5
        inf = ("ladder_delivery_lateness_seconds_bucket", (("le", "+Inf"),))
        assert after[inf] - before[inf] == 5
        # The ladder delivers up to one smallest rung (1 s) early, never later than a few seconds here.
        within = ("ladder_delivery_lateness_seconds_bucket", (("le", "10.0"),))
        early = ("ladder_delivery_lateness_seconds_bucket", (("le", "-10.0"),))
        assert after[within] - after[early] == 5
        assert {dict(labels)["queue"] for (name, labels) in after if name == "ladder_queue_messages"} == \
            set(LADDER_QUEUES)
        consumers = ("ladder_queue_consumers", (("queue", "acemq.schedule.due"),))
        wait_for(lambda: samples(scrape(url))[consumers] >= 1, 10, message="the relay counted as a consumer")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()


@pytest.mark.broker
def test_a_scrape_storm_costs_one_queue_sample_per_interval(connection: Connection, monkeypatch: pytest.MonkeyPatch,
                                                            broker_url: str) -> None:
    """50 scrapes a second for 10 s, a 2 s interval: at most 1 + 10/2 (+1 at the edge) samples of 7 declares."""
    passive: list[str] = []
    original = AmqpChannel.queue_declare

    def counting(self: AmqpChannel, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("passive") or (len(args) > 1 and args[1]):
            passive.append(args[0] if args else kwargs.get("queue", ""))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(AmqpChannel, "queue_declare", counting)
    from kombu_ladder import declare

    declare(connection)
    interval, duration, rate = 2.0, 10.0, 50
    server = MetricsServer(Counters(), connection, port=0, interval=interval).start()
    answered = 0
    try:
        start = time.monotonic()
        for i in range(int(duration * rate)):
            text = scrape(server.url)
            assert "ladder_queue_messages{queue=\"acemq.schedule.due\"}" in text
            answered += 1
            pause = start + (i + 1) / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # pacing the storm, not waiting for a result
        elapsed = time.monotonic() - start
    finally:
        server.stop()
    samples_taken = len(passive) / len(LADDER_QUEUES)
    print(f"\n{answered} scrapes in {elapsed:.1f} s; {len(passive)} passive declares = {samples_taken:g} samples")
    assert answered == duration * rate
    assert len(passive) % len(LADDER_QUEUES) == 0
    assert samples_taken <= 1 + math.ceil(elapsed / interval)


@pytest.mark.broker
def test_a_taken_port_is_one_line(connection: Connection, broker_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "kombu_ladder", "relay", "--broker", broker_url,
                               "--metrics-port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"Error: cannot serve the ladder's metrics on 127.0.0.1:{port}: [Errno 98] Address " \
                          "already in use\n"


def test_without_prometheus_client_the_relay_says_what_to_install() -> None:
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "from kombu_ladder.cli import main\n"
            f"sys.exit(main(['relay', '--broker', {UNREACHABLE!r}, '--metrics-port', '9808']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == ('Error: the metrics endpoint needs the [prometheus] extra (prometheus_client is '
                                   'not installed): pip install ".[prometheus]" from the root of a kombu-ladder '
                                   'clone, which brings prometheus-client>=0.17,<1')
    assert extra_requirement("prometheus") in done.stderr
    # And kombu_ladder itself works without it.
    plain = subprocess.run([sys.executable, "-c", "import sys; sys.modules['prometheus_client'] = None\n"
                            "import kombu_ladder, kombu_ladder.cli, kombu_ladder.relay"],
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr


@pytest.mark.broker
def test_the_sampler_thread_stops(connection: Connection) -> None:
    sampler = QueueSampler(connection.clone(), interval=0.05)
    sampler.start()
    assert sampler.samples >= 1
    sampler.stop()
    assert not any(t.name == "ladder-queue-sampler" and t.is_alive() for t in threading.enumerate())
