"""The control plane's one reader, on RabbitMQ and the simulator: resume, batches, re-created streams, skips."""

from __future__ import annotations

import logging
from typing import Any, Optional

from helpers import recreate_stream
from kombu import Producer

from kombu_ladder.controlplane import ADOPTIONS, CANCEL, CANCELLATIONS, ENTRY, declare_control_plane
from kombu_ladder.controlplane.codec import Cancel, Entries, Entry, encode, pack_ids
from kombu_ladder.controlplane.reader import Skips, StreamReader, read_to_end


def _write(conn: Any, records: list[Any], *, exchange: str = CANCEL.exchange, stream: str = CANCELLATIONS) -> None:
    producer = Producer(conn.default_channel, auto_declare=False)
    for record in records:
        producer.publish(encode(record), exchange=exchange, routing_key=stream, content_type="application/json",
                         content_encoding="utf-8", delivery_mode=2)


def _declare(conn: Any) -> None:
    channel = conn.channel()
    try:
        declare_control_plane(channel)
    finally:
        channel.close()


class _Ids:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.offsets: list[Optional[int]] = []

    def __call__(self, record: Any, offset: Optional[int]) -> None:
        assert isinstance(record, Cancel)
        self.ids += [c.id for c in record.each()]
        self.offsets.append(offset)


def _read_new_stream(conn: Any, backend: Any, prefix: str, n: int) -> tuple[StreamReader, _Ids, Any]:
    """A new cancellation stream holding ``n`` records, read to its end once: the reader, what it read, the result."""
    recreate_stream(conn, CANCELLATIONS)
    _write(conn, [Cancel((f"{prefix}-{i}",), int(backend.clock() * 1000)) for i in range(n)])
    seen = _Ids()
    reader = StreamReader(CANCELLATIONS, clock=backend.clock, timeout=20)
    return reader, seen, reader.read_to_end(conn, on_record=seen)


def test_a_reader_resumes_from_its_position_and_reads_no_record_twice(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        reader, seen, first = _read_new_stream(conn, ladder_backend, "a", 5)
        at = int(ladder_backend.clock() * 1000)
        assert seen.ids == [f"a-{i}" for i in range(5)] and first.records == 5
        assert seen.offsets == sorted(seen.offsets) and None not in seen.offsets
        _write(conn, [Cancel((f"b-{i}",), at) for i in range(3)])
        second = reader.read_to_end(conn, on_record=seen)  # a new channel: a reconnect
        assert seen.ids == [f"a-{i}" for i in range(5)] + [f"b-{i}" for i in range(3)]
        assert second.records == 3 and not second.reset and second.position == reader.position


def test_a_batch_record_is_expanded_and_single_id_records_still_read(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        recreate_stream(conn, CANCELLATIONS)
        at = int(ladder_backend.clock() * 1000)
        ids = [f"id-{i:05d}" for i in range(2500)]
        batches = pack_ids(ids, at=at)
        assert len(batches) == 3 and all(len(b.ids) <= 1000 for b in batches)
        _write(conn, [Cancel(("single",), at), *batches])
        seen = _Ids()
        result = read_to_end(conn, CANCELLATIONS, on_record=seen, clock=ladder_backend.clock, timeout=20)
        assert seen.ids == ["single", *ids] and result.records == 4 and result.skipped == 0


def test_a_deleted_and_declared_again_stream_is_read_from_its_start(ladder_backend: Any, caplog: Any) -> None:
    with ladder_backend.connection() as conn:
        reader, seen, _ = _read_new_stream(conn, ladder_backend, "old", 20)
        at = int(ladder_backend.clock() * 1000)
        assert reader.position is not None and reader.position >= 21
        recreate_stream(conn, CANCELLATIONS)
        _write(conn, [Cancel(("new-0",), at), Cancel(("new-1",), at)])
        resets: list[bool] = []
        seen.ids.clear()
        with caplog.at_level(logging.WARNING, logger="kombu_ladder.controlplane"):
            result = reader.read_to_end(conn, on_record=seen, on_reset=lambda: resets.append(True))
        assert result.reset and resets == [True] and reader.resets == 1
        assert seen.ids == ["new-0", "new-1"]
        assert "deleted and declared again" in caplog.text


def test_records_written_through_the_wrong_exchange_or_unknown_are_skipped_and_counted(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        recreate_stream(conn, ADOPTIONS)
        raw = Producer(conn.default_channel, auto_declare=False)
        for body, exchange in ((encode(Cancel(("x",), 1)), ENTRY.exchange),  # no route: the binding is by stream
                               (b'{"ladder":"snapshot-of-the-future","v":1}', "ladder.record.adopted"),
                               (b'{"ladder":"adopted","v":99}', "ladder.record.adopted"),
                               (b"\xff not json", "ladder.record.adopted"),
                               (encode(Entries((Entry(None, None, None, "", "q", 1, 1, 1),))), "")):
            raw.publish(body, exchange=exchange, routing_key=ADOPTIONS, content_type="application/json")
        skips = Skips()
        reader = StreamReader(ADOPTIONS, clock=ladder_backend.clock, timeout=20, skips=skips)
        got: list[Any] = []
        result = reader.read_to_end(conn, on_record=lambda record, offset: got.append(record))
        assert got == [] and result.skipped == 4
        assert dict(reader.skipped) == {"unknown": 2, "malformed": 1, "exchange": 1}
        assert skips.as_dict()[(ADOPTIONS, "index", "exchange")] == 1


def _drain_until(conn: Any, backend: Any, condition: Any, what: str) -> None:
    def step() -> Any:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass
        return condition()

    backend.wait_until(step, 20, what)


def test_the_callback_face_catches_up_tails_and_goes_on_after_a_new_channel(ladder_backend: Any) -> None:
    with ladder_backend.connection() as conn:
        recreate_stream(conn, CANCELLATIONS)
        at = int(ladder_backend.clock() * 1000)
        _write(conn, [Cancel(("before",), at)])
        seen = _Ids()
        caught: list[int] = []
        reader = StreamReader(CANCELLATIONS, clock=ladder_backend.clock, timeout=20)
        reader.start(conn.channel(), on_record=seen, on_caught_up=lambda: caught.append(len(seen.ids)))
        _drain_until(conn, ladder_backend, lambda: caught, "the catch-up")
        assert caught == [1] and seen.ids == ["before"]
        _write(conn, [Cancel(("tailed-1", "tailed-2"), at)])  # after the catch-up: read as it comes
        _drain_until(conn, ladder_backend, lambda: len(seen.ids) == 3, "the tailed batch")
        reader.tick()
        reader.close()  # a lost channel: the position stays
        _write(conn, [Cancel(("while-away",), at)])
        reader.start(conn.channel(), on_record=seen, on_caught_up=lambda: caught.append(len(seen.ids)))
        _drain_until(conn, ladder_backend, lambda: len(caught) == 2, "the second catch-up")
        assert seen.ids == ["before", "tailed-1", "tailed-2", "while-away"] and reader.resets == 0
        reader.close()


def test_the_adoption_reader_goes_on_from_its_offset_when_its_channel_opens_again(ladder_backend: Any) -> None:
    from celery_ladder.adoption.records import encode as encode_adoption
    from celery_ladder.adoption.transfer import Records
    from kombu_ladder.controlplane import ADOPTED

    eta, due = "2099-01-01T00:00:00+00:00", int(ladder_backend.clock() * 1000) + 3_600_000
    with ladder_backend.connection() as conn:
        recreate_stream(conn, ADOPTIONS)
        raw = Producer(conn.default_channel, auto_declare=False)

        def adopt(task_id: str) -> None:
            raw.publish(encode_adoption(task_id, eta, due=due), exchange=ADOPTED.exchange, routing_key=ADOPTIONS,
                        content_type="application/json", content_encoding="utf-8")

        for i in range(5):
            adopt(f"first-{i}")
        records = Records(conn, clock=ladder_backend.clock)
        try:
            assert records.catch_up(timeout=20) and records.reader.read == 5
            records.close()  # the worker's channel is gone
            adopt("later")
            assert records.catch_up(timeout=20)
            assert records.reader.read == 6, "the five first records were not read again"
            assert ("later", eta) in records.adopted and ("first-0", eta) in records.adopted
        finally:
            records.close()


def test_a_reader_with_a_small_prefetch_acks_as_it_reads_without_a_tick(ladder_backend: Any) -> None:
    """The snapshot reader's prefetch is 64 parts: a reader acks a quarter of its own prefetch at a time, so it
    never waits for the relay's tick to be given more (it did, every 64 parts: 2.2 s of a 2.6 s start)."""
    with ladder_backend.connection() as conn:
        recreate_stream(conn, CANCELLATIONS)
        at = int(ladder_backend.clock() * 1000)
        _write(conn, [Cancel((f"small-{i}",), at) for i in range(40)])
        seen = _Ids()
        caught: list[int] = []
        reader = StreamReader(CANCELLATIONS, clock=ladder_backend.clock, timeout=60, prefetch=4)
        reader.start(conn.channel(), on_record=seen, on_caught_up=lambda: caught.append(len(seen.ids)))
        _drain_until(conn, ladder_backend, lambda: caught, "the catch-up, never ticked")  # no reader.tick()
        assert caught == [40] and not reader.timed_out
        assert seen.ids == [f"small-{i}" for i in range(40)]
        reader.close()
