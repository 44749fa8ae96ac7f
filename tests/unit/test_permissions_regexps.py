"""The minimal-permission regexps of each role, matched against the names they must and must not cover."""

from __future__ import annotations

import re

import pytest

from kombu_ladder.contract import CONTROL, EXCHANGE, PARKING, rung_names
from kombu_ladder.permissions import Permissions, canceller, operator, producer, relay, union

LADDER = [EXCHANGE, *rung_names(), CONTROL, PARKING]


def matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None  # RabbitMQ's semantics: an unanchored search


@pytest.mark.parametrize("perms", [producer(["billing"]), relay(["billing"]), operator(["billing"])])
def test_every_role_covers_the_whole_ladder(perms: Permissions) -> None:
    for name in LADDER:
        assert matches(perms.configure, name) and matches(perms.write, name) and matches(perms.read, name)


@pytest.mark.parametrize("name", ["billing2", "xbilling", "celery", "amq.topic", "acemq.schedulex", "acemq", ""])
def test_nothing_else(name: str) -> None:
    for perms in (producer(["billing"]), relay(["billing"])):
        assert not matches(perms.write, name) and not matches(perms.configure, name)


def test_targets_are_written_not_configured_or_read() -> None:
    perms = relay(["billing", "a.b"])
    assert matches(perms.write, "billing") and matches(perms.write, "a.b") and not matches(perms.write, "aXb")
    assert not matches(perms.configure, "billing") and not matches(perms.read, "billing")


def test_the_relay_parks_through_the_default_exchange_and_the_producer_does_not_need_it() -> None:
    assert matches(relay([]).write, "amq.default")
    assert not matches(producer([]).write, "amq.default")
    assert matches(producer([""]).write, "amq.default")


def test_union_and_bad_targets() -> None:
    celery = Permissions(r"^celery", r"^celery", r"^celery")
    both = union(celery, relay(["celery"]))
    assert matches(both.read, "celery.pidbox") and matches(both.read, CONTROL)
    with pytest.raises(TypeError, match="targets"):
        relay("billing")
    with pytest.raises(TypeError, match="targets"):
        producer([1])  # type: ignore[list-item]


def test_the_relay_declares_and_reads_the_cancellations_and_a_canceller_records_them() -> None:
    stream = "ladder.cancellations"
    assert matches(relay([]).configure, stream) and matches(relay([]).read, stream)
    assert matches(producer([]).configure, stream) and not matches(producer([]).write, "amq.default")
    record = canceller()
    assert matches(record.configure, stream) and matches(record.write, "amq.default")
    assert not matches(record.read, stream) and not matches(record.configure, "acemq.schedule.due")
    assert not matches(relay([]).configure, "ladder.cancellationsx")
