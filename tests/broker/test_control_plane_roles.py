"""Issue 35: each role's exact generated row, on RabbitMQ, cannot forge a record of the control plane.

Each role is a real user with exactly the row :mod:`kombu_ladder.permissions` builds, on a vhost of
the test's own, with the control plane declared by the operator. Each tries every route it has into a
stream (the default exchange with the stream's name, and every kind's exchange it may write, the
marker exchange included) with genuine-looking records of the kinds that are not its own: a
cancellation of a waiting message, an index entry, an adoption record. The readers then see the
records in the streams and skip them all: the message is delivered, the index does not list the
entry, the adoption is not known. No role but the operator may delete a stream or an exchange of
the control plane. And a producer cannot make a relay write into the control plane for it.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import amqp
import pytest
from helpers import queue_depth, vhost_url, wait_for
from kombu import Connection, Exchange, Producer, Queue

from celery_ladder.adoption.records import encode as encode_adoption
from celery_ladder.adoption.transfer import Records
from kombu_ladder import LadderProducer, Relay, Scheduler, cancel, declare
from kombu_ladder.cancellation.records import encode as encode_cancel
from kombu_ladder.cancellation.stream import declare_cancellations
from kombu_ladder.contract import CONTENT_TYPE, CONTROL, DUE_AT, EXCHANGE, PARKING, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from kombu_ladder.controlplane import ADOPTIONS, CANCELLATIONS, INDEX, KINDS, NAMES, STREAMS
from kombu_ladder.index import IndexStore, sync
from kombu_ladder.index.records import encode_batch, entry
from kombu_ladder.permissions import (
    Permissions,
    adopter,
    canceller,
    index_reader,
    indexer,
    producer,
    relay,
    union,
)

pytestmark = pytest.mark.broker

BILLING = "billing"
TARGET = f"{BILLING}.q"

#: Each role's exact row; Celery's roles hold ``""`` among their targets, as the issue reproduced.
ROLES: dict[str, Permissions] = {
    "producer": producer([BILLING, ""]),
    "relay": relay([BILLING, ""]),
    "indexer": union(producer([BILLING, ""]), indexer()),
    "index-reader": index_reader(),
    "adopter": adopter(),
    "canceller": canceller(),
}
#: The kind each role may write in its own right: the one it does not try to forge.
OWN = {"canceller": "cancel", "indexer": "index", "adopter": "adopted"}


@pytest.fixture
def operator_url(fresh_vhost: str) -> str:
    """The ladder and the control plane, declared by the operator (guest, as ``kombu-ladder declare``)."""
    url = vhost_url(fresh_vhost)
    with Connection(url) as admin:
        declare(admin)
        declare_cancellations(admin)
        Queue(TARGET, Exchange(BILLING, type="direct", durable=True), routing_key="invoice.due",
              durable=True)(admin.default_channel).declare()
    return url


def _try(url: str, action: Callable[[Any], Any]) -> bool:
    """Run ``action(channel)`` as the user of ``url``; whether the broker accepted it (a round trip follows)."""
    with Connection(url) as conn:
        channel = conn.channel()
        try:
            action(channel)
            channel.basic_qos(0, 0, False)  # a round trip, to receive an asynchronous refusal
        except (amqp.exceptions.AccessRefused, amqp.exceptions.NotFound):
            return False
        return True


def _routes() -> list[tuple[str, str]]:
    """Every route into each stream: the default exchange by name, and each kind's exchange with the stream's key."""
    return [(exchange, stream.name) for stream in STREAMS for exchange in ("", *(k.exchange for k in KINDS))]


def _forge(url: str, bodies: dict[str, bytes], skip: str = "") -> int:
    """Publish each forged body (by kind) through every route the user of ``url`` has; return how many it took."""
    taken = 0
    for kind, body in bodies.items():
        if kind == skip:
            continue
        for exchange, routing_key in _routes():
            taken += _try(url, lambda channel, b=body, e=exchange, k=routing_key: channel.basic_publish(
                amqp.Message(b, content_type="application/json"), exchange=e, routing_key=k))
    return taken


def test_no_role_forges_a_cancellation_an_index_entry_or_an_adoption(
        operator_url: str, make_user: Callable[[str, Permissions], str]) -> None:
    now_ms = int(time.time() * 1000)
    with Connection(operator_url) as admin:
        sender = LadderProducer(admin.channel())
        for message_id in ("victim", "sibling"):
            sender.publish(b"{}", exchange=BILLING, routing_key="invoice.due", countdown=4, message_id=message_id)
    bodies = {
        "cancel": encode_cancel("victim", at=now_ms),
        "index": encode_batch([entry(message_id="forged-entry", task_id=None, task=None, exchange=BILLING,
                                     routing_key="invoice.due", due=now_ms + 3_600_000, at=now_ms, size=2)]),
        "adopted": encode_adoption("forged-task", "2099-01-01T00:00:00+00:00", due=now_ms + 3_600_000),
    }
    taken = {role: _forge(make_user(role, perms), bodies, skip=OWN.get(role, "")) for role, perms in ROLES.items()}
    # the routes are open (the default exchange, the marker exchange): the records are in the streams
    assert all(taken[role] > 0 for role in ("producer", "relay", "indexer", "index-reader", "adopter")), taken
    # the canceller's own right, through its exchange, as the contrast: the sibling is cancelled
    with Connection(make_user("canceller-own", canceller())) as conn:
        cancel(conn, "sibling")

    with Connection(operator_url) as admin:
        store = IndexStore(":memory:")
        result = sync(admin, store)
        assert not store.find("forged-entry", now_ms) and not store.find("victim", now_ms)
        assert result.skipped >= taken["producer"] // 3, result  # every forged record reached a stream, skipped
        records = Records(admin)
        try:
            assert records.catch_up(timeout=30)
            assert ("forged-task", "2099-01-01T00:00:00+00:00") not in records.adopted
            assert records.skipped > 0
        finally:
            records.close()
        with Scheduler.on(admin) as scheduler:
            wait_for(lambda: scheduler.delivered + scheduler.cancelled >= 2, 60,
                     message="the victim delivered and the sibling dropped")
            assert (scheduler.delivered, scheduler.cancelled) == (1, 1)
        got = []
        channel = admin.channel()
        while (message := channel.basic_get(TARGET, no_ack=True)) is not None:
            got.append(message.properties.get("message_id"))
        assert got == ["victim"]


@pytest.mark.parametrize("role", sorted(ROLES))
def test_no_role_deletes_or_declares_a_name_of_the_control_plane(
        operator_url: str, make_user: Callable[[str, Permissions], str], role: str) -> None:
    url = make_user(role, ROLES[role])
    for stream in (CANCELLATIONS, INDEX, ADOPTIONS):
        assert not _try(url, lambda channel, name=stream: channel.queue_delete(name)), stream
    for kind in KINDS:
        assert not _try(url, lambda channel, name=kind.exchange: channel.exchange_delete(name)), kind
    with Connection(operator_url) as admin:
        for name in (CANCELLATIONS, INDEX, ADOPTIONS):
            admin.default_channel.queue_declare(name, passive=True)  # all still there


def test_a_producer_cannot_make_the_relay_write_into_the_control_plane(
        operator_url: str, make_user: Callable[[str, Permissions], str]) -> None:
    """Expiries forged by a producer for every control-plane name are parked as refused; no record is written."""
    sender = make_user("producer", producer([BILLING, ""]))
    relaying = make_user("relay", relay([BILLING, ""]))
    targets = [(name, name) for name in NAMES] + [("", name) for name in NAMES]
    due = int(time.time() * 1000) - 1000
    with Connection(sender) as conn:
        raw = Producer(conn.channel(), auto_declare=False)
        for exchange, routing_key in targets:
            raw.publish(encode_cancel("anything", at=due), exchange=EXCHANGE, routing_key=CONTROL,
                        content_type="application/json", content_encoding="utf-8",
                        headers={TARGET_EXCHANGE: exchange, TARGET_ROUTING_KEY: routing_key, DUE_AT: due,
                                 CONTENT_TYPE: "application/json"})
    relay_process = Relay(Connection(relaying), allowed_exchanges=[BILLING, ""])
    thread = threading.Thread(target=relay_process.run, daemon=True)
    thread.start()
    try:
        with Connection(operator_url) as admin:
            wait_for(lambda: queue_depth(admin, PARKING) == len(targets), 60,
                     message=f"all {len(targets)} forged expiries parked")
            # nothing reached a stream (a stream's depth reads 0 over AMQP: read them instead)
            result = sync(admin, IndexStore(":memory:"))
            # markers alone (the relay's and the sync's, which are not records): no entry, no cancellation, no skip
            assert (result.records, result.entries, result.cancellations, result.skipped) == (0, 0, 0, 0), result
            records = Records(admin)
            try:
                assert records.catch_up(timeout=30) and records.skipped == 0
            finally:
                records.close()
    finally:
        relay_process.stop()
        thread.join(15)
        relay_process.connection.release()
