"""Issue 22: the index's permission rows, given to real users in a vhost of the test's own.

A producer with exactly ``producer() + indexer()`` indexes what it schedules, and a user with
``index_reader()`` alone finds it; a producer with ``producer()`` alone still schedules, its
messages are delivered, the refusal is logged once on ``kombu_ladder.index`` and nothing is
raised to it (a refused publish on its own channel used to close that channel, and its next
publish raised ``AccessRefused``). Each user is created with ``rabbitmqctl add_user`` and
deleted afterwards.
"""

from __future__ import annotations

import logging
from typing import Callable

import pytest
from helpers import queue_depth, vhost_url, wait_for
from kombu import Connection, Exchange, Queue

from kombu_ladder import LadderProducer, Scheduler, declare
from kombu_ladder.index import IndexStore, sync
from kombu_ladder.index.records import STREAM as INDEX
from kombu_ladder.index.writer import declare_index
from kombu_ladder.permissions import Permissions, index_reader, indexer, producer, union

pytestmark = pytest.mark.broker

BILLING = "billing"
TARGET = f"{BILLING}.q"
N = 5


@pytest.fixture
def admin_url(fresh_vhost: str) -> str:
    """The ladder and the application's ``billing`` exchange and queue, declared by their owner (guest)."""
    url = vhost_url(fresh_vhost)
    with Connection(url) as admin:
        declare(admin)
        Queue(TARGET, Exchange(BILLING, type="direct", durable=True), routing_key="invoice.due",
              durable=True)(admin.default_channel).declare()
    return url


def _schedule(url: str, countdown: float) -> LadderProducer:
    """Schedule N messages for ``billing`` with ``index=True`` as the user of ``url``; return the producer."""
    with Connection(url) as conn:
        sender = LadderProducer(conn.channel(), index=True)
        for i in range(N):
            sender.publish(b"{}", exchange=BILLING, routing_key="invoice.due", countdown=countdown + i / 100,
                           message_id=f"m-{i}", content_type="application/json")
        conn.default_channel.basic_qos(0, 0, False)  # a round trip on the connection, needing no permission
    return sender


def test_a_producer_with_the_indexer_row_indexes_and_an_index_reader_finds_its_entries(
        admin_url: str, make_user: Callable[[str, Permissions], str], tmp_path: object) -> None:
    with Connection(admin_url) as admin:  # the operator's 'declare': the control plane, which no other role may
        declare_index(admin.default_channel)
    sender = _schedule(make_user("indexer", union(producer([BILLING]), indexer())), 3600)
    assert sender.index is not None
    assert (sender.index.sent, sender.index.lost, sender.index.refused) == (N, 0, None)
    store = IndexStore(str(tmp_path) + "/index.sqlite")  # type: ignore[operator]
    with Connection(make_user("reader", index_reader())) as reading:
        result = sync(reading, store)
    assert (result.entries, result.skipped) == (N, 0)
    now = int(LadderProducer.clock() * 1000)
    for i in range(N):
        [row] = store.find(f"m-{i}", now)
        assert row.state == "waiting" and row.entry.exchange == BILLING
        assert 3600_000 <= row.entry.due - row.entry.at <= 3600_000 + i * 10 + 1
    store.close()


@pytest.mark.parametrize("stream", ["missing", "declared by the operator"])
def test_a_producer_without_the_indexer_row_schedules_and_delivers_and_logs_the_refusal_once(
        admin_url: str, make_user: Callable[[str, Permissions], str], stream: str,
        caplog: pytest.LogCaptureFixture) -> None:
    if stream != "missing":
        with Connection(admin_url) as admin:
            declare_index(admin.default_channel)
    url = make_user("producer", producer([BILLING]))
    with caplog.at_level(logging.INFO, logger="kombu_ladder.index"):
        sender = _schedule(url, 1.5)  # raises nothing: the refusal never reaches the producer's channel
    assert sender.index is not None
    assert (sender.index.sent, sender.index.lost) == (0, N) and sender.index.refused
    warned = [r.getMessage() for r in caplog.records if r.name == "kombu_ladder.index" and r.levelno >= logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("unindexed: ") and "indexer()" in warned[0], warned
    assert "ladder.record.index" in warned[0] and "may not be written" in warned[0]  # RabbitMQ: 403 before 404
    with Connection(admin_url) as admin, Scheduler.on(admin) as relay:
        wait_for(lambda: relay.delivered == N, 60, message=f"{N} delivered")
        assert queue_depth(admin, TARGET) == N
        store = IndexStore(":memory:")
        assert sync(admin, store).entries == 0
        assert store.position(INDEX) == (1, 0)  # ladder.index holds the sync's own marker alone: nothing got in
