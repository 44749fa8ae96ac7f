"""Fault: the broker node restarts (cleanly, or SIGKILLed) under the index of waiting work.

Producers index N messages in ``ladder.index``; the node goes down and comes back on the same
data, and a producer indexes more once the stream is served. A fresh index file then finds them all with their due
times, and a sync that had read part of the stream before the restart goes on from its offset:
every entry once, none lost.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import amqp
import pytest
from kombu import Connection, Queue

from kombu_ladder import LadderProducer
from kombu_ladder.controlplane.codec import Marker, encode
from kombu_ladder.index import IndexStore, sync
from kombu_ladder.index.records import STREAM as INDEX

from .conftest import PrivateNode
from .faultkit import wait_until

pytestmark = pytest.mark.broker

#: Messages indexed, half before a first (partial) sync and half after it.
N = 400
#: Messages indexed right after the node is back.
AFTER = 20
TARGET = "faults.index.target"


def _index(url: str, start: int, count: int) -> None:
    """Schedule ``count`` messages (an hour and i seconds ahead) with ``index=True``; return when the broker has
    them (a round trip on the channel the entries went on)."""
    with Connection(url) as conn:
        channel = conn.channel()
        sender = LadderProducer(channel, index=True)
        for i in range(start, start + count):
            sender.publish(b"{}", routing_key=TARGET, countdown=3600 + i, message_id=f"m-{i}",
                           correlation_id=f"t-{i}", headers={"task": "faults.index", "id": f"t-{i}"},
                           content_type="application/json")
        assert sender.index is not None and (sender.index.sent, sender.index.lost) == (count, 0)
        channel.basic_qos(0, 0, False)  # a round trip: the broker has taken every publish before it


def _synced(url: str, store: IndexStore) -> int:
    with Connection(url) as conn:
        return sync(conn, store, timeout=60).entries


def _entries(store: IndexStore) -> dict[str, tuple[int, int]]:
    """message id -> (due, published at), every entry of the store; fails on a duplicate."""
    rows = store._db.execute("SELECT message_id, due, at FROM entries").fetchall()
    found = {message_id: (due, at) for message_id, due, at in rows}
    assert len(found) == len(rows), f"{len(rows) - len(found)} duplicated entries"
    return found


def _served(url: str) -> bool:
    """Whether ``ladder.index`` takes records again: a marker (which readers skip) is confirmed within 2 s."""
    with Connection(url) as conn:
        channel = conn.channel()
        try:
            channel.confirm_select()
            channel.basic_publish_confirm(amqp.Message(encode(Marker(uuid.uuid4().hex, 0))), exchange="",
                                          routing_key=INDEX, mandatory=True, confirm_timeout=2)
        except (amqp.exceptions.MessageNacked, TimeoutError, *conn.channel_errors):
            return False
    return True


def _kill9(node: PrivateNode) -> None:
    """SIGKILL the node's Erlang VM (its pid file exists while it runs), and wait until its port closes."""
    pid = int((node.base / "node.pid").read_text().strip())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not node.reachable(), 30, "the node to die")


@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_the_index_survives_a_broker_restart_and_a_sync_resumes_from_its_offset(
        how: str, private_node: PrivateNode, fault_url: str, tmp_path: Path, report: dict[str, Any]) -> None:
    with Connection(fault_url) as conn:
        Queue(TARGET, durable=True)(conn.default_channel).declare()
    started = time.monotonic()
    _index(fault_url, 0, N // 2)
    partial = IndexStore(str(tmp_path / "partial.sqlite"))
    assert _synced(fault_url, partial) == N // 2
    read_to, _ = partial.position(INDEX)
    _index(fault_url, N // 2, N - N // 2)
    before = IndexStore(str(tmp_path / "before.sqlite"))
    assert _synced(fault_url, before) == N  # everything is in the stream before the node goes down
    expected = _entries(before)

    down = time.monotonic()
    if how == "restart":
        private_node.restart()
    else:
        _kill9(private_node)
        private_node.start()
    down_s = time.monotonic() - down
    # A stream is served again a few seconds after the node has booted; what is sent to it before is dropped
    # (unconfirmed: the writer cannot count it; docs/waiting.rst says so). Index more once it is served.
    back = time.monotonic()
    wait_until(lambda: _served(fault_url), 60, "ladder.index served again")
    served_s = time.monotonic() - back
    _index(fault_url, N, AFTER)

    fresh = IndexStore(str(tmp_path / "fresh.sqlite"))
    fresh_entries = _synced(fault_url, fresh)
    resumed = _synced(fault_url, partial)
    report.update(how=how, indexed=N + AFTER, fresh_sync=fresh_entries, resumed_sync=resumed, read_to_before=read_to,
                  broker_down_s=round(down_s, 1), stream_served_after_s=round(served_s, 1),
                  total_s=round(time.monotonic() - started, 1))
    after = _entries(fresh)
    assert fresh_entries == N + AFTER and {k: after[k] for k in expected} == expected
    for i in range(N + AFTER):
        due, at = after[f"m-{i}"]
        assert due - at == (3600 + i) * 1000
    assert resumed == N - N // 2 + AFTER, "the partial sync goes on from its offset: only what it had not read"
    assert _entries(partial) == after
    assert [row.state for row in fresh.find("t-7", int(time.time() * 1000))] == ["waiting"]
    for store in (partial, before, fresh):
        store.close()
