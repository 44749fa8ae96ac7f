"""The minimal-permission regexps of each role, matched against the names they must and must not cover."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kombu_ladder.cancellation.records import STREAM
from kombu_ladder.contract import CONTROL, EXCHANGE, PARKING, rung_names
from kombu_ladder.controlplane import ADOPTED, CANCEL, ENTRY, KINDS, MARKER, NAMES, STREAMS
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


def test_the_relay_reads_the_cancellations_and_a_canceller_only_writes_them() -> None:
    assert matches(relay([]).read, STREAM) and not matches(relay([]).configure, STREAM)
    assert not matches(relay([]).write, STREAM) and not matches(relay([]).write, CANCEL.exchange)
    assert matches(relay([]).write, MARKER.exchange)  # its catch-up marker
    assert not matches(producer([]).configure, STREAM) and not matches(producer([]).write, STREAM)
    record = canceller()
    assert matches(record.write, CANCEL.exchange)
    for name in [STREAM, *LADDER, *NAMES, "amq.default", "celery"]:
        assert not matches(record.configure, name) and not matches(record.read, name), name
        assert name == CANCEL.exchange or not matches(record.write, name), name


def test_the_operator_declares_and_binds_the_whole_control_plane() -> None:
    perms = operator([])
    for name in NAMES:
        assert matches(perms.configure, name) and matches(perms.write, name) and matches(perms.read, name), name


#: Each role's row (targets: billing, and the default exchange where a Celery role has it).
ROLES = {"producer": producer(["billing", ""]), "canceller": canceller(), "relay": relay(["billing", ""]),
         "adopter": adopter(), "indexer": indexer(), "index-reader": index_reader()}
#: The kinds each role may write (through the kind's exchange, the only way a reader accepts it).
WRITES = {"producer": set(), "canceller": {"cancel"}, "relay": {"marker", "snapshot", "seal"},
          "adopter": {"adopted", "marker"}, "indexer": {"index"}, "index-reader": {"marker"}}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_no_role_but_the_operator_configures_a_control_plane_name_or_writes_a_kind_not_its_own(role: str) -> None:
    perms = ROLES[role]
    for name in NAMES:
        assert not matches(perms.configure, name), name
    for kind in KINDS:
        assert matches(perms.write, kind.exchange) == (kind.name in WRITES[role]), kind
    for stream in STREAMS:  # write on a stream lets one bind it to an exchange one can read
        assert not matches(perms.write, stream.name), stream


def test_a_control_plane_exchange_is_never_a_target() -> None:
    for name in NAMES:
        for role in (producer, relay, operator):
            with pytest.raises(ValueError, match="control plane"):
                role([name])


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


def test_an_adopter_reads_its_stream_and_writes_the_ladders_exchange_and_its_kinds() -> None:
    from celery_ladder.adoption.records import STREAM as ADOPTIONS

    perms = adopter()
    assert matches(perms.read, ADOPTIONS) and not matches(perms.configure, ADOPTIONS)
    assert matches(perms.write, EXCHANGE) and matches(perms.write, ADOPTED.exchange)
    assert not matches(perms.write, "amq.default")
    for name in [*rung_names(), CONTROL, PARKING, STREAM, "celery", "ladder.adoptionsx"]:
        assert not matches(perms.configure, name) and not matches(perms.read, name), name
        assert not matches(perms.write, name), name


def test_an_indexer_writes_the_entry_exchange_only() -> None:
    perms = indexer()
    assert matches(perms.write, ENTRY.exchange)
    for name in [*LADDER, *NAMES, "billing", "amq.default", "ladder.indexx"]:
        assert not matches(perms.configure, name) and not matches(perms.read, name), name
        assert name == ENTRY.exchange or not matches(perms.write, name), name
    both = union(producer(["billing"]), indexer())
    assert matches(both.write, EXCHANGE) and matches(both.write, "billing") and not matches(both.configure, INDEX)
    assert not matches(both.configure, CONTROL) and not matches(both.read, INDEX)


def test_an_index_reader_reads_both_streams_and_writes_its_markers_through_the_marker_exchange() -> None:
    perms = index_reader()
    for name in (INDEX, STREAM):
        assert matches(perms.read, name) and not matches(perms.configure, name), name
        assert not matches(perms.write, name), name
    assert matches(perms.write, MARKER.exchange) and not matches(perms.write, "amq.default")
    for name in [*LADDER, "billing", "ladder.adoptions", "ladder.indexx"]:
        assert not matches(perms.configure, name) and not matches(perms.read, name), name
        assert not matches(perms.write, name), name
