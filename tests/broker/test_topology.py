"""declare(): on a recording fake channel, then on the real broker (read back with rabbitmqctl)."""

from __future__ import annotations

from typing import Any

import pytest
from amqp.exceptions import PreconditionFailed
from helpers import list_bindings, list_exchanges, list_queues, vhost_url
from kombu import Connection, Queue

from kombu_ladder import LadderProducer, TopologyConflict, declare

NAMES = [
    "acemq.schedule.1h",
    "acemq.schedule.10m",
    "acemq.schedule.1m",
    "acemq.schedule.10s",
    "acemq.schedule.1s",
    "acemq.schedule.due",
]


def rung_args(ttl_ms: int) -> dict[str, Any]:
    return {
        "x-message-ttl": ttl_ms,
        "x-dead-letter-exchange": "acemq.schedule",
        "x-dead-letter-routing-key": "acemq.schedule.due",
    }


#: What the broker must hold after declare, written out by hand (not from the library's constants).
EXPECTED_QUEUES = {
    "acemq.schedule.1h": rung_args(3600000),
    "acemq.schedule.10m": rung_args(600000),
    "acemq.schedule.1m": rung_args(60000),
    "acemq.schedule.10s": rung_args(10000),
    "acemq.schedule.1s": rung_args(1000),
    "acemq.schedule.due": {},
    "acemq.schedule.parked": {},
}

EXPECTED_BINDINGS = {
    ("acemq.schedule", "acemq.schedule.1h", "acemq.schedule.1h"),
    ("acemq.schedule", "acemq.schedule.10m", "acemq.schedule.10m"),
    ("acemq.schedule", "acemq.schedule.1m", "acemq.schedule.1m"),
    ("acemq.schedule", "acemq.schedule.10s", "acemq.schedule.10s"),
    ("acemq.schedule", "acemq.schedule.1s", "acemq.schedule.1s"),
    ("acemq.schedule", "acemq.schedule.due", "acemq.schedule.due"),
}


class RecordingChannel:
    """Records the declarations made on it; can refuse one queue with PRECONDITION_FAILED."""

    def __init__(self, refuse: str = "") -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refuse = refuse

    def prepare_queue_arguments(self, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return dict(arguments)

    def exchange_declare(self, **kwargs: Any) -> None:
        self.calls.append(("exchange_declare", kwargs))

    def queue_declare(self, **kwargs: Any) -> tuple[str, int, int]:
        self.calls.append(("queue_declare", kwargs))
        if kwargs["queue"] == self.refuse:
            raise PreconditionFailed("PRECONDITION_FAILED - inequivalent arg 'x-message-ttl'")
        return kwargs["queue"], 0, 0

    def queue_bind(self, **kwargs: Any) -> None:
        self.calls.append(("queue_bind", kwargs))

    def of(self, method: str) -> list[dict[str, Any]]:
        return [kw for name, kw in self.calls if name == method]


# -- recording fake channel ------------------------------------------------------


def test_declare_returns_rungs_longest_first_then_control() -> None:
    assert declare(RecordingChannel()) == NAMES


def test_declare_records_the_exchange() -> None:
    channel = RecordingChannel()
    declare(channel)
    exchanges = {(kw["exchange"], kw["type"], kw["durable"], kw["auto_delete"], kw["passive"])
                 for kw in channel.of("exchange_declare")}
    assert exchanges == {("acemq.schedule", "direct", True, False, False)}
    assert channel.calls[0][0] == "exchange_declare"


def test_declare_records_each_queue_with_exactly_the_contract_arguments() -> None:
    channel = RecordingChannel()
    declare(channel)
    queues = {kw["queue"]: kw for kw in channel.of("queue_declare")}
    assert {name: kw["arguments"] or {} for name, kw in queues.items()} == EXPECTED_QUEUES
    for name, kw in queues.items():
        assert (kw["durable"], kw["auto_delete"], kw["exclusive"], kw["passive"]) == (True, False, False, False), name
    declared_order = [kw["queue"] for kw in channel.of("queue_declare")]
    assert declared_order[:6] == NAMES


def test_declare_records_the_bindings() -> None:
    channel = RecordingChannel()
    declare(channel)
    bindings = {(kw["exchange"], kw["queue"], kw["routing_key"]) for kw in channel.of("queue_bind")}
    assert bindings == EXPECTED_BINDINGS  # the parking queue is bound to nothing


def test_declare_turns_precondition_failed_into_topology_conflict() -> None:
    with pytest.raises(TopologyConflict) as info:
        declare(RecordingChannel(refuse="acemq.schedule.10s"))
    message = str(info.value)
    assert "acemq.schedule.10s" in message
    assert "'x-message-ttl': 10000" in message
    assert "shared with the other AceMQ" in message
    assert info.value.name == "acemq.schedule.10s"
    assert isinstance(info.value.__cause__, PreconditionFailed)


# -- real broker -----------------------------------------------------------------


def test_declare_on_the_broker_matches_the_literal_contract(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        assert declare(conn) == NAMES
    queues = list_queues(fresh_vhost)
    assert {name: q["arguments"] for name, q in queues.items()} == EXPECTED_QUEUES
    for name, q in queues.items():
        assert (q["durable"], q["auto_delete"], q["exclusive"]) == (True, False, False), name
    assert list_exchanges(fresh_vhost)["acemq.schedule"] == {
        "type": "direct", "durable": True, "auto_delete": False, "arguments": {},
    }
    assert list_bindings(fresh_vhost) == EXPECTED_BINDINGS


def test_declare_is_idempotent_and_queues_read_back_passively(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        first = declare(conn)
        second = declare(conn.default_channel)
        assert first == second == NAMES
        channel = conn.channel()
        for name in [*NAMES, "acemq.schedule.parked"]:
            assert channel.queue_declare(queue=name, passive=True)[0] == name
        # A literal, non-passive re-declaration is equivalent (the broker would refuse anything else).
        for name, arguments in EXPECTED_QUEUES.items():
            channel.queue_declare(queue=name, durable=True, auto_delete=False, arguments=arguments)
        channel.exchange_declare(exchange="acemq.schedule", type="direct", durable=True, auto_delete=False)
        channel.close()
    assert {name: q["arguments"] for name, q in list_queues(fresh_vhost).items()} == EXPECTED_QUEUES


def test_precondition_conflict_on_the_broker(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        other = conn.channel()
        other.queue_declare(queue="acemq.schedule.10s", durable=True, auto_delete=False,
                            arguments={"x-message-ttl": 15000, "x-dead-letter-exchange": "acemq.schedule",
                                       "x-dead-letter-routing-key": "acemq.schedule.due"})
        other.close()
        with pytest.raises(TopologyConflict) as info:
            declare(conn)
        message = str(info.value)
        assert "'acemq.schedule.10s'" in message
        for needed in ("'x-message-ttl': 10000", "'x-dead-letter-exchange': 'acemq.schedule'",
                       "'x-dead-letter-routing-key': 'acemq.schedule.due'"):
            assert needed in message
        assert "shared with the other AceMQ scheduler libraries" in message
        assert "PRECONDITION_FAILED" in message
        # The caller's connection (and its default channel) is still usable.
        assert conn.connected
        conn.default_channel.queue_declare(queue="still-usable", durable=False, auto_delete=True)
        assert conn.default_channel.queue_declare(queue="acemq.schedule.1h", passive=True)[0] == "acemq.schedule.1h"
    assert list_queues(fresh_vhost)["acemq.schedule.10s"]["arguments"]["x-message-ttl"] == 15000


def test_precondition_conflict_on_the_exchange(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        other = conn.channel()
        other.exchange_declare(exchange="acemq.schedule", type="topic", durable=True, auto_delete=False)
        other.close()
        with pytest.raises(TopologyConflict) as info:
            declare(conn)
        assert "'acemq.schedule'" in str(info.value)
        assert "direct" in str(info.value)
        assert conn.default_channel.queue_declare(queue="", exclusive=True)[0]


def test_a_conflict_on_first_delayed_publish_leaves_the_producer_usable(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        other = conn.channel()
        other.queue_declare(queue="acemq.schedule.1m", durable=True, auto_delete=False,
                            arguments={"x-message-ttl": 60000})  # two arguments short of the contract
        other.close()
        target = Queue("t.plain", durable=True).bind(conn.default_channel)
        target.declare()
        producer = LadderProducer(conn.default_channel)
        with pytest.raises(TopologyConflict, match="acemq.schedule.1m"):
            producer.publish(b"later", routing_key="t.plain", countdown=90)
        producer.publish(b"now", routing_key="t.plain")  # the producer's own channel survived
        assert target.get(no_ack=True).body == b"now"
