"""The hostile corpus against the standalone relay on RabbitMQ and on the simulator (tests/hostile_corpus.py).

Valid messages interleaved with the corpus are delivered exactly once; every hostile
message is parked with its reason or passed on untouched; the relay keeps running,
its counters count exactly what happened, and nothing stays on the control queue.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import hostile_corpus as corpus
import pytest
from helpers import broker_release, depth_on, wait_for
from kombu import Connection

from kombu_ladder import Relay, declare
from kombu_ladder.contract import CONTROL
from kombu_ladder.pytest_plugin import simulated_rabbitmq
from kombu_ladder.simulator import SimulatedBroker

#: How long (seconds; virtual on the simulator) the relay may take over the whole corpus.
DEADLINE = 60


def run_corpus(channel: Any, now_ms: int, wait: Callable[[Callable[[], Any], str], Any],
               release: tuple[int, ...]) -> list[corpus.Case]:
    """Declare the targets, put the interleaved corpus on the control queue, wait until every fate is sealed."""
    declare(channel)
    corpus.declare_targets(channel)
    ordered, _ = corpus.interleaved(now_ms, release)
    for case in ordered:
        corpus.publish(channel, case)
    want = corpus.expected_depths(ordered)
    wait(lambda: all(depth_on(channel, q) == n for q, n in want.items()) and depth_on(channel, CONTROL) == 0,
         "every message of the corpus delivered or parked")
    return ordered


def expected_counters(ordered: list[corpus.Case], reasons: list[str], received: int) -> dict[str, int]:
    """What the counters must say: exactly what reached each queue."""
    return {
        "received": received,
        "delivered": sum(c.expect != "park" for c in ordered),
        # The fanout's retry: the delivery was refused, sent back into the 1 s rung once, refused again.
        "hops": 1,
        "malformed": sum(r.startswith("malformed:") for r in reasons),
        "parked": len(reasons),
        "refused": 2,
        "cancelled": 0,
    }


def no_raw_control_characters(records: list[logging.LogRecord]) -> None:
    for record in records:
        text = record.getMessage()
        assert "\x1b" not in text and "\x00" not in text, text


@pytest.fixture
def relay_on(corpus_url: str) -> Iterator[Relay]:
    relay = Relay(Connection(corpus_url))
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    assert relay.ready.wait(20), "the relay did not start"
    yield relay
    relay.stop()
    thread.join(15)
    relay.connection.release()
    assert not thread.is_alive()


@pytest.mark.broker
def test_the_standalone_relay_survives_the_corpus_and_seals_every_fate(
    corpus_url: str, relay_on: Relay, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with Connection(corpus_url) as conn:
        channel = conn.channel()
        ordered = run_corpus(channel, int(time.time() * 1000),
                             lambda cond, what: wait_for(cond, DEADLINE, interval=0.1, message=what),
                             broker_release())
        wait_for(lambda: relay_on.core.outstanding == 0 and relay_on.counters.parked == len(
            [c for c in ordered if c.expect == "park"]), 10, message="the last confirms")
        reasons = corpus.check_outcomes(channel, ordered)
    assert relay_on.counters.as_dict() == expected_counters(ordered, reasons, relay_on.counters.received)
    assert relay_on.counters.received >= len(ordered) + 1  # the fanout's retry came back once
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mb < corpus.BOMB / 2**20 / 2, f"the bomb was inflated: the process grew by {grown_mb:.0f} MB"
    no_raw_control_characters(caplog.records)


def test_the_simulated_relay_survives_the_corpus_and_seals_every_fate(caplog: pytest.LogCaptureFixture,
                                                                       request: pytest.FixtureRequest) -> None:
    broker = SimulatedBroker(expiry_lag=0.002, rabbitmq=simulated_rabbitmq(request.config))
    broker.set_permissions(write=corpus.WRITE_PERMISSION)
    relay = broker.host(Relay())
    try:
        with broker.connection() as conn:
            channel = conn.channel()

            def wait(cond: Callable[[], Any], what: str) -> None:
                deadline = broker.now() + DEADLINE
                while not cond():
                    assert broker.now() < deadline, f"timed out (virtual) waiting for {what}"
                    broker.advance(0.1)

            release = tuple(int(part) for part in broker.profile.name.split("."))
            ordered = run_corpus(channel, broker.now_ms, wait, release)
            reasons = corpus.check_outcomes(channel, ordered)
        assert relay.core.outstanding == 0
        assert relay.counters.as_dict() == expected_counters(ordered, reasons, relay.counters.received)
        no_raw_control_characters(caplog.records)
    finally:
        broker.close()
