"""A relay's start bounded by live state: it loads the newest complete snapshot of ``ladder.snapshots`` and reads
only the cancellation records after it; an incomplete or forged snapshot is ignored; a reconnect goes on from the
last record read. On RabbitMQ (a vhost of each test's own) and on the simulator."""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any, Callable, Iterator

import pytest
from backends import RabbitBackend, SimulatorBackend
from helpers import recreate_stream, vhost_url
from kombu import Connection

from kombu_ladder import declare, permissions
from kombu_ladder.cancellation.stream import cancel_many
from kombu_ladder.controlplane import CANCELLATIONS, SEAL, SNAPSHOT, SNAPSHOTS, declare_control_plane
from kombu_ladder.controlplane.codec import Part, Seal, encode, pack_ids
from kombu_ladder.controlplane.snapshots import Policy
from kombu_ladder.link import RawMessage, link_for, publish
from kombu_ladder.relay.cancelwatch import CancelWatch

#: A policy that writes a snapshot after 10 records, in parts of 4 entries, with no spacing.
SMALL = dict(every_records=10, every_ms=3_600_000, min_spacing_ms=0, part_entries=4, jitter=0.0)


@pytest.fixture(params=[pytest.param("rabbitmq", marks=pytest.mark.broker), "simulator"])
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A broker with nothing in it yet: a fresh vhost of RabbitMQ, or a fresh simulator."""
    if request.param == "simulator":
        simulated = SimulatorBackend()
        try:
            yield simulated
        finally:
            simulated.close()
        return
    yield RabbitBackend(vhost_url(request.getfixturevalue("fresh_vhost")))


class Watch:
    """A CancelWatch on a connection of its own, driven by the test (as a relay's loop drives it)."""

    def __init__(self, backend: Any, **policy: Any) -> None:
        self.backend = backend
        self.connection: Connection = backend.connection()
        self.watch = CancelWatch(clock=backend.clock, policy=Policy(**{**SMALL, **policy}))
        self.ready = False
        self.start()

    def start(self) -> None:
        self.ready = False
        channel = self.connection.channel()
        if isinstance(self.backend, SimulatorBackend):
            self.backend.broker.drive(self.connection, tick=self.watch.tick)
        self.watch.start(channel, link_for(channel).guard, self._ready)
        self.until(lambda: self.ready, "caught up")

    def _ready(self) -> None:
        self.ready = True

    def until(self, condition: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
        if isinstance(self.backend, SimulatorBackend):
            self.backend.wait_until(condition, timeout, what)
            return
        deadline = time.monotonic() + timeout
        last_tick = 0.0
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            try:
                self.connection.drain_events(timeout=0.1)
            except socket.timeout:
                pass
            if time.monotonic() - last_tick > 0.2:
                self.watch.tick()
                last_tick = time.monotonic()

    def snapshot_written(self) -> Seal:
        """Wait until a snapshot covering every record read so far is sealed; return its seal."""
        self.until(lambda: self.watch._known is not None and self.watch._known.covers == self.watch.position,
                   "a snapshot covering the records read")
        assert self.watch._known is not None
        return self.watch._known

    def close(self) -> None:
        self.watch.close()
        self.connection.release()


def _cancel(backend: Any, conn: Connection, prefix: str, count: int) -> list[str]:
    """Cancel ``count`` new ids (``cancel_many``: batch records); return them."""
    ids = [f"{prefix}-{n}-{uuid.uuid4().hex[:6]}" for n in range(count)]
    cancel_many(conn, ids, clock=backend.clock)
    return ids


def _sealed(backend: Any) -> Seal:
    """A relay starts, seals a snapshot of every record so far and stops; the seal."""
    first = Watch(backend)
    try:
        return first.snapshot_written()
    finally:
        first.close()


def _records(ids: list[str]) -> int:
    """How many records ``cancel_many`` writes for ``ids`` (batches)."""
    return len(pack_ids(ids, at=0))


def _cancelled(watch: CancelWatch, ids: list[str]) -> list[str]:
    return [i for i in ids if watch.cancelled(i) is not None]


def _write(connection: Connection, records: list[tuple[bytes, str]]) -> None:
    """Publish records into the snapshot stream, each through the exchange given (confirmed, as guest)."""
    channel = connection.channel()
    try:
        channel.confirm_select()
        for body, exchange in records:
            publish(channel, RawMessage(body, b"\x00\x00"), exchange, SNAPSHOTS)
        channel.basic_qos(0, 1, False)  # a round trip: every publish before it is in the stream
    finally:
        channel.close()


def test_a_start_loads_the_newest_snapshot_and_reads_only_the_records_after_it(backend: Any) -> None:
    with backend.connection() as conn:
        declare(conn)
        early = _cancel(backend, conn, "early", 25)
        first = Watch(backend)
        seal = first.snapshot_written()
        assert first.watch.written == 1 and seal.parts == 7  # 25 live in parts of 4
        late = _cancel(backend, conn, "late", 3)
        first.until(lambda: len(_cancelled(first.watch, late)) == 3, "the late records read")
        first.close()
        second = Watch(backend)
        try:
            assert second.watch.loaded == seal
            assert _cancelled(second.watch, early + late) == early + late
            # it read the late records alone (and the first relay's marker, which is not handed on)
            assert second.watch.cancellations.read == _records(late)
        finally:
            second.close()


def test_a_start_without_a_snapshot_reads_back_and_then_writes_one(backend: Any) -> None:
    with backend.connection() as conn:
        declare(conn)
        ids = _cancel(backend, conn, "back", 5)
        watch = Watch(backend)
        try:
            assert watch.watch.loaded is None
            assert watch.watch.cancellations.read == _records(ids)
            assert _cancelled(watch.watch, ids) == ids
            watch.snapshot_written()  # none known: the first is written at once
        finally:
            watch.close()


def test_a_snapshot_of_a_stream_since_deleted_and_declared_again_is_dropped(backend: Any) -> None:
    """The snapshot names an offset past the new stream's end: the start must not wait there (RabbitMQ 3.10 would,
    for ever), and what the snapshot held is forgotten with the stream it was of."""
    with backend.connection() as conn:
        declare(conn)
        old = _cancel(backend, conn, "old", 25)
        seal = _sealed(backend)
        recreate_stream(conn, CANCELLATIONS)
        new = _cancel(backend, conn, "new", 2)
        assert _records(new) <= seal.covers  # the new stream ends before the offset the snapshot names
        second = Watch(backend)
        try:
            assert second.watch.cancellations.resets == 1 and second.watch.loaded is None
            assert _cancelled(second.watch, old) == [] and _cancelled(second.watch, new) == new
        finally:
            second.close()


def test_an_incomplete_snapshot_is_ignored(backend: Any) -> None:
    with backend.connection() as conn:
        declare(conn)
        ids = _cancel(backend, conn, "kept", 6)
        seal = _sealed(backend)
        # Newer-looking snapshots that would un-cancel everything: parts without a seal, a seal counting a part
        # more than was written, a seal with a part missing. Each is ignored.
        now = int(backend.clock() * 1000)
        empty = Part("unsealed", 0, ())
        short = [Part("short", 0, ()), Seal("short", 2, seal.covers + 100, now)]
        gap = [Part("gap", 1, ()), Seal("gap", 2, seal.covers + 100, now)]
        _write(conn, [(encode(empty), SNAPSHOT.exchange)]
               + [(encode(r), SNAPSHOT.exchange if isinstance(r, Part) else SEAL.exchange) for r in short + gap])
        second = Watch(backend)
        try:
            assert second.watch.loaded == seal
            assert _cancelled(second.watch, ids) == ids
        finally:
            second.close()


def test_a_snapshot_forged_through_the_default_exchange_is_refused(backend: Any) -> None:
    with backend.connection() as conn:
        declare(conn)
        ids = _cancel(backend, conn, "forged", 4)
        now = int(backend.clock() * 1000)
        forged = [Part("forged", 0, ()), Seal("forged", 1, 10_000, now)]  # would skip every record, cancel nothing
        _write(conn, [(encode(r), "") for r in forged]
               + [(encode(forged[0]), SEAL.exchange), (encode(forged[1]), SNAPSHOT.exchange)])
        watch = Watch(backend)
        try:
            assert watch.watch.loaded is None
            assert sum(watch.watch.snapshots.skipped.values()) >= 4  # once per window read
            assert _cancelled(watch.watch, ids) == ids
        finally:
            watch.close()


def test_a_reconnect_goes_on_from_the_last_record_read(backend: Any) -> None:
    with backend.connection() as conn:
        declare(conn)
        before = _cancel(backend, conn, "before", 12)
        watch = Watch(backend)
        try:
            watch.snapshot_written()
            loaded, read, position = watch.watch.loaded, watch.watch.cancellations.read, watch.watch.position
            assert position is not None
            watch.connection.release()  # the connection is lost
            after = _cancel(backend, conn, "after", 2)
            watch.connection = backend.connection()
            watch.start()
            assert watch.watch.loaded == loaded  # nothing reloaded
            assert watch.watch.cancellations.read == read + _records(after)  # nothing read twice
            assert _cancelled(watch.watch, before + after) == before + after
        finally:
            watch.close()


@pytest.mark.broker
@pytest.mark.parametrize("role", ["producer-with-default", "canceller", "indexer", "index-reader", "adopter"])
def test_no_role_but_the_relay_may_write_a_snapshot(role: str, fresh_vhost: str,
                                                     make_user: Callable[[str, Any], str]) -> None:
    rows = {"producer-with-default": permissions.producer(["", "billing"]), "canceller": permissions.canceller(),
            "indexer": permissions.indexer(), "index-reader": permissions.index_reader(),
            "adopter": permissions.adopter()}
    with Connection(vhost_url(fresh_vhost)) as conn:
        declare(conn)
        declare_control_plane(conn.default_channel)
    url = make_user(role, rows[role])
    for exchange in (SNAPSHOT.exchange, SEAL.exchange):
        with Connection(url) as conn:
            channel = conn.channel()
            channel.confirm_select()
            with pytest.raises(conn.channel_errors, match="ACCESS_REFUSED"):
                publish(channel, RawMessage(encode(Seal("x", 1, 1, 1)), b"\x00\x00"), exchange, SNAPSHOTS)
                channel.basic_qos(0, 1, False)
    relay_url = make_user("relay", permissions.relay(["billing"]))
    with Connection(relay_url) as conn:
        _write(conn, [(encode(Part("ok", 0, ())), SNAPSHOT.exchange), (encode(Seal("ok", 1, 0, 1)), SEAL.exchange)])
