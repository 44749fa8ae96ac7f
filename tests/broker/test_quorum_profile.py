"""The quorum profile: declare(..., queue_type="quorum"), its conflicts, its TTL and dead-lettering on the broker."""

from __future__ import annotations

import time
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import list_queues, vhost_url, wait_for
from kombu import Connection, Consumer, Queue
from test_topology import EXPECTED_QUEUES, NAMES, RecordingChannel, rung_args

from kombu_ladder import Scheduler, TopologyConflict, declare
from kombu_ladder.cli import cli
from kombu_ladder.relay import Relay
from kombu_ladder.topology import check_queue_type, queue_arguments

QUORUM_EXTRA = {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}

#: The quorum profile, written out by hand: the contract's arguments plus three on every rung; the
#: control queue parks what spends its delivery limit.
EXPECTED_QUORUM = {
    **{name: {**args, **QUORUM_EXTRA} for name, args in EXPECTED_QUEUES.items() if name.endswith(("h", "m", "s"))
       and name != "acemq.schedule.parked"},
    "acemq.schedule.due": {"x-queue-type": "quorum", "x-dead-letter-exchange": "",
                           "x-dead-letter-routing-key": "acemq.schedule.parked",
                           "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
    "acemq.schedule.parked": {},
}


def test_the_classic_profile_is_exactly_the_contract() -> None:
    assert queue_arguments(60) == rung_args(60000)
    assert queue_arguments(60, "classic") == rung_args(60000)
    assert queue_arguments(1, "quorum") == {**rung_args(1000), **QUORUM_EXTRA}


@pytest.mark.parametrize("bad", ["Quorum", "stream", "", None, 1])
def test_an_unknown_queue_type_is_refused_naming_the_argument(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"queue_type must be \"classic\" .* or \"quorum\""):
        declare(RecordingChannel(), queue_type=bad)
    with pytest.raises(ValueError, match="--x"):
        check_queue_type(bad, argument="--x")


def test_quorum_declare_records_the_quorum_arguments() -> None:
    channel = RecordingChannel()
    assert declare(channel, queue_type="quorum") == NAMES
    queues = {kw["queue"]: kw["arguments"] or {} for kw in channel.of("queue_declare")}
    assert queues == EXPECTED_QUORUM


def test_the_relay_command_takes_queue_type() -> None:
    result = CliRunner().invoke(cli, ["relay", "--help"])
    assert result.exit_code == 0 and "--queue-type" in result.output and "quorum" in result.output
    result = CliRunner().invoke(cli, ["relay", "--queue-type", "stream"])
    assert result.exit_code == 2 and "'stream' is not one of 'classic', 'quorum'" in result.output


def test_relay_refuses_a_bad_queue_type() -> None:
    with pytest.raises(ValueError, match="queue_type"):
        Relay(Connection("memory://"), queue_type="mirrored")


# -- real broker -----------------------------------------------------------------


def test_quorum_declare_on_the_broker(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        assert declare(conn, queue_type="quorum") == NAMES
        assert declare(conn.default_channel, queue_type="quorum") == NAMES  # idempotent
    queues = list_queues(fresh_vhost)
    assert {name: q["arguments"] for name, q in queues.items()} == EXPECTED_QUORUM
    for name, q in queues.items():
        assert (q["durable"], q["auto_delete"], bool(q["exclusive"])) == (True, False, False), name


@pytest.mark.parametrize("first,second", [("classic", "quorum"), ("quorum", "classic")])
def test_a_profile_conflict_says_which_profile_and_how_to_choose(fresh_vhost: str, first: str, second: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        declare(conn, queue_type=first)
        with pytest.raises(TopologyConflict) as info:
            declare(conn, queue_type=second)
        message = str(info.value)
        assert info.value.name == "acemq.schedule.1h" and info.value.queue_type == second
        assert f"declared by the {first} profile" in message
        assert f"this side declares the {second} profile (queue_type='{second}')" in message
        assert "ladder_queue_type" in message and "CELERY_LADDER_QUEUE_TYPE" in message and "--queue-type" in message
        assert "PRECONDITION_FAILED" in message
        assert conn.default_channel.queue_declare(queue="acemq.schedule.1h", passive=True)[0] == "acemq.schedule.1h"
    expected = EXPECTED_QUEUES if first == "classic" else EXPECTED_QUORUM
    assert {name: q["arguments"] for name, q in list_queues(fresh_vhost).items()} == expected


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_rungs_expire_and_dead_letter_through_the_relay(fresh_vhost: str, queue_type: str) -> None:
    """Queue TTL and (for quorum, at-least-once) dead-lettering, end to end, with the lateness measured."""
    delays = [1.0, 2.0, 2.5, 11.0, 12.0] * 4
    lateness: dict[int, float] = {}
    due: dict[int, float] = {}
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        target = Queue("quorum.target", durable=True)
        target(conn.default_channel).declare()
        # hold_window=0: every residual takes the rungs (this measures TTL and dead-lettering, hops included)
        with Scheduler.on(conn, serializer="json", queue_type=queue_type, hold_window=0) as scheduler:
            for n, delay in enumerate(delays):
                due[n] = time.time() + delay
                scheduler.in_(delay, {"n": n}, routing_key="quorum.target")

            def on_message(body: Any, message: Any) -> None:
                lateness[body["n"]] = time.time() - due[body["n"]]
                message.ack()

            with Connection(url) as reader:
                with Consumer(reader, [Queue("quorum.target", durable=True)], callbacks=[on_message],
                              accept=["json"]):
                    deadline = time.monotonic() + 60
                    while len(lateness) < len(delays) and time.monotonic() < deadline:
                        try:
                            reader.drain_events(timeout=0.5)
                        except TimeoutError:
                            pass
            relay = scheduler._relay
            assert relay is not None
            # A delivery reaches its consumer before its confirm reaches the relay, which counts it then.
            wait_for(lambda: relay.counters.delivered >= len(delays), 10, message="the relay's confirms",
                     on_timeout=lambda: str(relay.counters.as_dict()))
            counters = relay.counters.as_dict()
    assert sorted(lateness) == list(range(len(delays))), f"missing: {set(range(len(delays))) - set(lateness)}"
    assert min(lateness.values()) > -1.0, "up to 1 s early, never more (the contract's precision)"
    assert max(lateness.values()) < 3.0, f"{queue_type} expiry lag too large: {sorted(lateness.values())}"
    assert counters["delivered"] == len(delays) and counters["hops"] > 0, counters
    print(f"\n{queue_type} lateness: median {sorted(lateness.values())[len(lateness) // 2]:.3f}s, "
          f"max {max(lateness.values()):.3f}s over {len(delays)} messages")
    arguments = list_queues(fresh_vhost)["acemq.schedule.10s"]["arguments"]
    assert arguments == (EXPECTED_QUORUM if queue_type == "quorum" else EXPECTED_QUEUES)["acemq.schedule.10s"]
