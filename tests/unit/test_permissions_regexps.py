"""The minimal-permission regexps of each role, matched against the names they must and must not cover."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kombu_ladder.cancellation.records import STREAM
from kombu_ladder.contract import CONTROL, EXCHANGE, PARKING, rung_names
from kombu_ladder.index.records import STREAM as INDEX
from kombu_ladder.permissions import (
    Permissions,
    adopter,
    canceller,
    index_reader,
    indexer,
    operator,
    producer,
    relay,
    union,
)

LADDER = [EXCHANGE, *rung_names(), CONTROL, PARKING]


def matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None  # RabbitMQ's semantics: an unanchored search


@pytest.mark.parametrize("perms", [relay(["billing"]), operator(["billing"])])
def test_the_relay_and_the_operator_cover_the_whole_ladder(perms: Permissions) -> None:
    for name in LADDER:
        assert matches(perms.configure, name) and matches(perms.write, name) and matches(perms.read, name)


def test_a_producer_writes_the_ladders_exchange_and_its_targets_and_configures_and_reads_nothing() -> None:
    perms = producer(["billing"])
    assert matches(perms.write, EXCHANGE) and matches(perms.write, "billing")
    for name in [*LADDER, STREAM, "billing", "amq.default"]:
        assert not matches(perms.configure, name) and not matches(perms.read, name), name
    for name in [*rung_names(), CONTROL, PARKING, STREAM, "amq.default"]:  # write on a queue lets one bind it
        assert not matches(perms.write, name), name


@pytest.mark.parametrize("name", ["billing2", "xbilling", "celery", "amq.topic", "acemq.schedulex", "acemq", ""])
def test_nothing_else(name: str) -> None:
    for perms in (producer(["billing"]), relay(["billing"])):
        assert not matches(perms.write, name)
        # "^$" is RabbitMQ's way to grant nothing: no exchange or queue is named "" in a permission check
        # (the default exchange is amq.default, an unnamed queue gets a server-made name).
        assert not matches(perms.configure, name) or (perms.configure, name) == ("^$", "")


def test_targets_are_written_not_configured_or_read() -> None:
    perms = relay(["billing", "a.b"])
    assert matches(perms.write, "billing") and matches(perms.write, "a.b") and not matches(perms.write, "aXb")
    assert not matches(perms.configure, "billing") and not matches(perms.read, "billing")


def test_the_relay_parks_through_the_default_exchange_and_the_producer_does_not_need_it() -> None:
    assert matches(relay([]).write, "amq.default")
    assert not matches(producer([]).write, "amq.default")
    assert matches(producer([""]).write, "amq.default")
    assert not matches(canceller().write, "amq.default")


def test_union_and_bad_targets() -> None:
    celery = Permissions(r"^celery", r"^celery", r"^celery")
    both = union(celery, relay(["celery"]))
    assert matches(both.read, "celery.pidbox") and matches(both.read, CONTROL)
    with pytest.raises(TypeError, match="targets"):
        relay("billing")
    with pytest.raises(TypeError, match="targets"):
        producer([1])  # type: ignore[list-item]


def test_the_relay_declares_and_reads_the_cancellations_and_a_canceller_only_writes_them() -> None:
    assert matches(relay([]).configure, STREAM) and matches(relay([]).read, STREAM)
    assert not matches(relay([]).write, STREAM)  # it reads the stream; its marker goes through amq.default
    assert not matches(producer([]).configure, STREAM) and not matches(producer([]).write, STREAM)
    record = canceller()
    assert matches(record.write, STREAM)  # the exchange cancellers publish to (and the queue of that name)
    for name in [STREAM, *LADDER, "amq.default", "celery"]:
        assert not matches(record.configure, name) and not matches(record.read, name), name
        assert name == STREAM or not matches(record.write, name), name
    assert not matches(relay([]).configure, "ladder.cancellationsx")


def test_the_operator_binds_the_stream_to_its_exchange() -> None:
    perms = operator([])
    assert matches(perms.configure, STREAM) and matches(perms.write, STREAM) and matches(perms.read, STREAM)


def _documented_rows() -> dict[str, tuple[str, str, str]]:
    """The rows of docs/guarantees.rst's permissions table: role -> (configure, write, read)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "guarantees.rst").read_text(encoding="utf-8")
    table = text[text.index("   * - role\n"):]
    table = table[:table.index("\n\n")]
    rows = {}
    for chunk in table.split("   * - ")[2:]:
        cells = [cell.strip() for cell in chunk.split("\n     - ")]
        rows[cells[0].split()[0]] = tuple(cell.strip("`") for cell in cells[1:])
    return rows


def test_the_guarantees_page_shows_the_rows_the_module_builds() -> None:
    built = {"producer": producer(["billing"]), "canceller": canceller(), "relay": relay(["billing"]),
             "operator": operator(["billing"]), "adopter": adopter(), "indexer": indexer(),
             "index-reader": index_reader()}
    assert _documented_rows() == {role: perms.as_args() for role, perms in built.items()}


def test_an_adopter_declares_reads_and_writes_its_stream_and_writes_the_ladders_exchange() -> None:
    from celery_ladder.adoption.records import STREAM as ADOPTIONS

    perms = adopter()
    assert matches(perms.configure, ADOPTIONS) and matches(perms.read, ADOPTIONS)
    assert matches(perms.write, EXCHANGE) and matches(perms.write, "amq.default")
    for name in [*rung_names(), CONTROL, PARKING, STREAM, "celery", "ladder.adoptionsx"]:
        assert not matches(perms.configure, name) and not matches(perms.read, name), name
        assert not matches(perms.write, name), name


def test_an_indexer_declares_the_index_and_writes_through_the_default_exchange_only() -> None:
    perms = indexer()
    assert matches(perms.configure, INDEX) and matches(perms.write, "amq.default")
    for name in [*LADDER, STREAM, "billing", "amq.default", "ladder.indexx", "ladder.adoptions"]:
        assert not matches(perms.configure, name) and not matches(perms.read, name), name
    for name in [*LADDER, STREAM, INDEX, "billing"]:  # write on the stream itself would let it bind it
        assert not matches(perms.write, name), name
    both = union(producer(["billing"]), indexer())
    assert matches(both.write, EXCHANGE) and matches(both.write, "billing") and matches(both.configure, INDEX)
    assert not matches(both.configure, CONTROL) and not matches(both.read, INDEX)


def test_an_index_reader_declares_and_reads_both_streams_and_writes_its_markers_through_the_default_exchange() -> None:
    perms = index_reader()
    for name in (INDEX, STREAM):
        assert matches(perms.configure, name) and matches(perms.read, name), name
        assert not matches(perms.write, name), name
    assert matches(perms.write, "amq.default")
    for name in [*LADDER, "billing", "ladder.adoptions", "ladder.indexx"]:
        assert not matches(perms.configure, name) and not matches(perms.read, name), name
        assert not matches(perms.write, name), name
