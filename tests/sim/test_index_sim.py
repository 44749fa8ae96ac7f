"""The index of waiting work end to end on the simulator: producers index, a sync reads, the CLI answers and cancels."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from backends import SimulatorBackend, declare_target, depth
from kombu import Producer

from kombu_ladder import LadderProducer, Scheduler
from kombu_ladder.cli import main
from kombu_ladder.controlplane import ENTRY
from kombu_ladder.index import Filter, IndexStore, sync
from kombu_ladder.index.records import STREAM, encode_batch, entry

pytestmark = pytest.mark.unit

HOUR = 3600


@pytest.fixture
def backend() -> Any:
    simulated = SimulatorBackend()
    yield simulated
    simulated.close()


def _schedule(conn: Any, backend: SimulatorBackend, n: int, *, task: str = "billing.send_invoice",
              queue: str = "t.index", start: int = 0) -> list[str]:
    """Publish ``n`` Celery-shaped task messages an hour or more ahead with the index on; return their task ids."""
    ids = []
    with Scheduler.on(conn, relay=False, clock=backend.clock, index=True) as scheduler:
        for i in range(start, start + n):
            task_id = f"{task}-{i}"
            scheduler.in_(HOUR + i, b"{}", routing_key=queue, correlation_id=task_id,
                          headers={"task": task, "id": task_id}, content_type="application/json")
            ids.append(task_id)
    return ids


def _cli(backend: SimulatorBackend, index: Path, *argv: str, capsys: Any) -> tuple[int, str, str]:
    code = main(["--broker", backend.broker.url, *argv, "--index", str(index)])
    out, err = capsys.readouterr()
    return code, out, err


def test_find_list_and_count_answer_from_the_index(backend: SimulatorBackend, tmp_path: Path, capsys: Any) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        declare_target(conn, "t.mail")
        invoices = _schedule(conn, backend, 30)
        _schedule(conn, backend, 5, task="mail.remind", queue="t.mail")
    index = tmp_path / "index.sqlite"
    code, out, err = _cli(backend, index, "waiting", "find", invoices[7], capsys=capsys)
    assert code == 0, err
    assert f"{invoices[7]}" in out and "waiting" in out and "billing.send_invoice" in out and "'t.index'" in out
    assert "read 35 new entr(y/ies) from ladder.index" in err
    code, out, _ = _cli(backend, index, "waiting", "count", "--by", "task", "--json", capsys=capsys)
    counts = {tuple(c["key"]): c["count"] for c in json.loads(out)["counts"]}
    assert (code, counts) == (0, {("billing.send_invoice",): 30, ("mail.remind",): 5})
    code, out, _ = _cli(backend, index, "waiting", "list", "--task", "billing.send_invoice", "--limit", "10",
                        "--offset", "10", "--json", capsys=capsys)
    rows = json.loads(out)["rows"]
    assert [r["task_id"] for r in rows] == invoices[10:20]  # soonest due first, the second page
    code, out, _ = _cli(backend, index, "waiting", "count", "--target", "", "--routing-key", "t.mail", capsys=capsys)
    assert out.strip() == "5"
    code, out, err = _cli(backend, index, "waiting", "find", "no-such-id", capsys=capsys)
    assert code == 1 and "the index has no message with the id 'no-such-id'" in err


def test_a_message_stops_waiting_when_it_falls_due_or_is_cancelled(backend: SimulatorBackend, tmp_path: Path) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        ids = _schedule(conn, backend, 3)
        store = IndexStore(str(tmp_path / "i.sqlite"))
        Scheduler.on(conn, relay=False, clock=backend.clock).cancel(ids[0])
        sync(conn, store)
        now = int(backend.clock() * 1000)
        assert [store.find(i, now)[0].state for i in ids] == ["cancelled", "waiting", "waiting"]
        backend.broker.advance(HOUR + 1.5)  # the second is due now, the third not yet
        now = int(backend.clock() * 1000)
        assert [store.find(i, now)[0].state for i in ids] == ["cancelled", "due", "waiting"]
        assert store.count(Filter(), now) == [((), 1)]
        store.close()


def test_bulk_cancel_dry_run_records_nothing_and_the_real_one_drops_every_match(
        backend: SimulatorBackend, tmp_path: Path, capsys: Any) -> None:
    index = tmp_path / "index.sqlite"
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        declare_target(conn, "t.mail")
        invoices = _schedule(conn, backend, 20)
        reminders = _schedule(conn, backend, 4, task="mail.remind", queue="t.mail")
        code, out, err = _cli(backend, index, "cancel", "--task", "billing.send_invoice", "--dry-run", capsys=capsys)
        assert code == 0, err
        lines = out.strip().splitlines()
        assert [line.split("\t")[0] for line in lines[:-1]] == invoices
        assert lines[-1].startswith("dry run: would cancel 20 waiting message(s)")
        store = IndexStore(str(index))
        sync(conn, store)
        now = int(backend.clock() * 1000)
        assert store.count(Filter(task="billing.send_invoice"), now) == [((), 20)]  # nothing was cancelled
        code, out, err = _cli(backend, index, "cancel", "--task", "billing.send_invoice", capsys=capsys)
        assert code == 0 and "recorded a cancellation for 20 id(s)" in out, err
        sync(conn, store)
        now = int(backend.clock() * 1000)
        assert store.count(Filter(), now, by="task") == [(("mail.remind",), 4)]
        store.close()
        with Scheduler.on(conn, clock=backend.clock) as relay:  # a relay drops the cancelled ones as they come due
            backend.wait_until(lambda: relay.delivered == len(reminders), timeout=2 * HOUR, message="the reminders")
            backend.wait_until(lambda: relay.cancelled == len(invoices), timeout=2 * HOUR, message="the invoices")
            assert depth(conn, "t.index") == 0 and depth(conn, "t.mail") == 4


def test_bulk_cancel_needs_a_task_or_a_target(backend: SimulatorBackend, tmp_path: Path, capsys: Any) -> None:
    code, _, err = _cli(backend, tmp_path / "i.sqlite", "cancel", "--due-before", "+1h", capsys=capsys)
    assert code == 2 and "give the ids to cancel, or --task/--target" in err
    code, _, err = _cli(backend, tmp_path / "i.sqlite", "cancel", "x", "--task", "y", capsys=capsys)
    assert code == 2 and "give ids, or --task/--target, not both" in err


def test_a_sync_goes_on_from_where_the_last_stopped_and_skips_bad_records(
        backend: SimulatorBackend, tmp_path: Path, caplog: Any) -> None:
    path = str(tmp_path / "i.sqlite")
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        _schedule(conn, backend, 10)
        store = IndexStore(path)
        assert sync(conn, store).entries == 10
        store.close()
        raw = Producer(conn.channel())
        for body in (b"not json", b'{"ladder":"index","v":1,"n":[{"e":"","r":"q","d":-1,"a":0}]}', b"[]",
                     b'{"ladder":"index","v":2,"n":[]}', b"\xff" * 10, b'{"ladder":"index","v":1,"n":"x"}') * 5:
            raw.publish(body, exchange="", routing_key=STREAM)
        due = int(backend.clock() * 1000) + 60_000
        forged = encode_batch([entry(message_id="forged", task_id=None, task=None, exchange="", routing_key="q",
                                     due=due, at=0, size=3)])
        raw.publish(forged, exchange="", routing_key=STREAM)  # a genuine record, but through the default exchange
        raw.publish(encode_batch([entry(message_id="late", task_id=None, task=None, exchange="", routing_key="q",
                                        due=due, at=0, size=3)]),
                    exchange=ENTRY.exchange, routing_key=STREAM)
        store = IndexStore(path)  # a new process: the file remembers the offset
        with caplog.at_level(logging.WARNING, logger="kombu_ladder.index"):  # the sync's notices log there
            result = sync(conn, store)
        assert (result.entries, result.skipped) == (1, 31)
        warnings = [r for r in caplog.records if "skipping a record in" in r.getMessage()]
        assert 1 <= len(warnings) <= 10  # rate-limited, not one line per bad record
        assert store.position(STREAM)[1] == 31 and len(store) == 11
        assert store.find("late", int(backend.clock() * 1000))[0].state == "waiting"
        assert not store.find("forged", int(backend.clock() * 1000))
        store.close()


def test_an_index_write_that_fails_fails_the_publish_and_no_message_waits_unindexed(
        backend: SimulatorBackend) -> None:
    """The entry is written (confirmed) before the message: when it cannot be, the publish raises, and nothing
    waits in a rung without its entry."""
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        producer = LadderProducer(conn.channel(), index=True)
        assert producer.index is not None

        def refuse(record: bytes) -> None:
            raise ConnectionError("the index stream is gone")

        producer._send_index_record = refuse  # type: ignore[method-assign]
        for i in range(3):
            with pytest.raises(ConnectionError, match="the index stream is gone"):
                producer.publish(b"x", routing_key="t.index", countdown=HOUR, message_id=f"m{i}")
        assert producer.index.sent == 0
        assert depth(conn, "acemq.schedule.1h") == 0


def test_every_publish_returns_with_its_entry_in_the_index(backend: SimulatorBackend) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        producer = LadderProducer(conn.channel(), index=True)
        assert producer.index is not None
        for i in range(1000):
            producer.publish(b"x", routing_key="t.index", countdown=HOUR, message_id=f"m{i}")
            assert producer.index.sent == i + 1  # confirmed before publish returned
        result = sync(conn, IndexStore(":memory:"))
        # one record per publish (the producer's write check is routed nowhere; markers are not records)
        assert (result.entries, result.records) == (1000, 1000)


def test_celery_eta_tasks_are_indexed_with_ladder_index(ladder_celery: Any, tmp_path: Path) -> None:
    from celery import shared_task

    @shared_task(name="sim.index.send_invoice")
    def send_invoice(n: int) -> int:
        return n

    app = ladder_celery.app
    broker = ladder_celery.broker
    sent = send_invoice.apply_async((0,), countdown=HOUR)  # ladder_index is off by default: not indexed
    app.conf.ladder_index = True
    indexed = [send_invoice.apply_async((n,), countdown=2 * HOUR + n) for n in range(1, 4)]
    send_invoice.delay(9)  # no ETA: not waiting, not indexed
    writer = app.amqp.Producer.shared_index
    assert (writer.sent, writer.lost) == (3, 0)  # each entry confirmed before its task was published
    with broker.connection() as conn:
        store = IndexStore(str(tmp_path / "i.sqlite"))
        sync(conn, store)
        now = int(broker.now() * 1000)
        assert store.find(sent.id, now) == []
        [row] = store.find(indexed[1].id, now)
        assert (row.state, row.entry.task, row.entry.task_id, row.entry.routing_key) == \
            ("waiting", "sim.index.send_invoice", indexed[1].id, "celery")
        assert row.entry.due - row.entry.at == (2 * HOUR + 2) * 1000
        assert store.count(Filter(), now, by="task") == [(("sim.index.send_invoice",), 3)]
        store.close()


def test_celery_ladder_waiting_and_bulk_cancel_answer_as_kombu_ladder_does(backend: SimulatorBackend,
                                                                           tmp_path: Path) -> None:
    import os
    from unittest import mock

    from celery.bin.celery import celery
    from click.testing import CliRunner

    with backend.connection() as conn:
        declare_target(conn, "t.index")
        ids = _schedule(conn, backend, 3)
    index = str(tmp_path / "i.sqlite")

    def run(*argv: str) -> Any:
        with mock.patch.dict(os.environ):  # celery's command sets CELERY_BROKER_URL (and more) in os.environ
            return CliRunner().invoke(celery, ["-b", backend.broker.url, "ladder", *argv, "--index", index])

    found = run("waiting", "find", ids[1])
    assert found.exit_code == 0 and found.stdout.startswith(f"{ids[1]}: waiting"), found.output
    counted = run("waiting", "count", "--by", "task")
    assert counted.exit_code == 0 and "3  billing.send_invoice" in counted.stdout, counted.output
    dry = run("cancel", "--task", "billing.send_invoice", "--dry-run")
    assert dry.exit_code == 0 and [line.split("\t")[0] for line in dry.stdout.splitlines()[:3]] == ids, dry.output
    cancelled = run("cancel", "--task", "billing.send_invoice")
    assert cancelled.exit_code == 0 and "recorded a cancellation for 3 id(s)" in cancelled.stdout, cancelled.output
    after = run("waiting", "count")
    assert after.exit_code == 0 and after.stdout.strip() == "0", after.output


def test_a_first_sync_reads_the_cancellations_as_old_as_the_entries(backend: SimulatorBackend,
                                                                     tmp_path: Path) -> None:
    """A month-long wait cancelled on its first day: a relay drops it within the hour, then forgets the record.
    An index read for the first time three days later still shows it cancelled, not waiting."""
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        with Scheduler.on(conn, relay=False, clock=backend.clock, index=True) as scheduler:
            ids = [scheduler.in_(30 * 24 * HOUR, b"{}", routing_key="t.index") for _ in range(2)]
        backend.broker.advance(600)
        Scheduler.on(conn, relay=False, clock=backend.clock).cancel(ids[0])
        backend.broker.advance(3 * 24 * HOUR)
        store = IndexStore(str(tmp_path / "i.sqlite"))
        assert sync(conn, store).cancellations == 1
        now = int(backend.clock() * 1000)
        assert [store.find(i, now)[0].state for i in ids] == ["cancelled", "waiting"]
        store.close()


def test_a_reschedule_and_a_run_now_reach_the_index_at_the_next_sync(backend: SimulatorBackend,
                                                                     tmp_path: Path) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        later, now, kept = _schedule(conn, backend, 3)
        store = IndexStore(str(tmp_path / "index.sqlite"))
        sync(conn, store, clock=backend.clock)
        old = store.find(later, int(backend.clock() * 1000))[0].entry.due
        with Scheduler.on(conn, relay=False, clock=backend.clock) as scheduler:
            moved = scheduler.reschedule(later, 2 * HOUR)
            ran = scheduler.run_now(now)
        assert moved.indexed and ran.indexed
        assert store.find(later, int(backend.clock() * 1000))[0].entry.due == old  # until the next sync
        assert sync(conn, store, clock=backend.clock).entries == 2
        at = int(backend.clock() * 1000)
        assert [(r.entry.due, r.state) for r in store.find(later, at)] == [(moved.due_at, "waiting")]
        assert [(r.entry.due, r.state) for r in store.find(now, at)] == [(ran.due_at, "due")]
        assert [r.entry.task_id for r in store.listing(Filter(), at)] == [kept, later]
        store.close()


@pytest.mark.parametrize("stream", ["missing", "declared by the operator"])
def test_a_producer_without_the_indexer_rights_schedules_unindexed_and_says_so_once(
        backend: SimulatorBackend, stream: str, caplog: pytest.LogCaptureFixture) -> None:
    """The simulator's side of tests/broker/test_index_permissions.py: the producer row alone, index=True."""
    from kombu_ladder import declare
    from kombu_ladder.index.writer import declare_index
    from kombu_ladder.permissions import producer

    with backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.index", exchange="billing")
        if stream != "missing":
            declare_index(conn.default_channel)
    rights = producer(["billing"])
    backend.broker.set_permissions(configure=rights.configure, write=rights.write, read=rights.read)
    with backend.connection() as conn, caplog.at_level(logging.WARNING, logger="kombu_ladder.index"):
        sender = LadderProducer(conn.channel(), index=True, clock=backend.clock)
        for i in range(5):
            sender.publish(b"x", exchange="billing", routing_key="t.index", countdown=HOUR + i, message_id=f"m{i}")
    assert sender.index is not None and (sender.index.sent, sender.index.lost) == (0, 5)
    warned = [r.getMessage() for r in caplog.records if r.name == "kombu_ladder.index"]
    assert len(warned) == 1 and warned[0].startswith("unindexed: "), warned
    backend.broker.set_permissions()
    with backend.connection() as conn:
        assert depth(conn, "acemq.schedule.1h") == 5


def test_waiting_list_says_how_many_wait_unindexed_and_how_producers_turn_the_index_on(
        backend: SimulatorBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: messages nobody indexed gave an empty list and exit 0, without a word."""
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        indexed = _schedule(conn, backend, 3)
        with Scheduler.on(conn, relay=False, clock=backend.clock) as plain:  # the index off, as by default
            for i in range(4):
                plain.in_(HOUR + i, b"{}", routing_key="t.index")
    index = tmp_path / "index.sqlite"
    code, out, err = _cli(backend, index, "waiting", "list", capsys=capsys)
    assert code == 0, err
    assert [line.split()[2] for line in out.splitlines()[1:]] == indexed
    assert ("4 message(s) wait in the ladder that the index does not list: only what producers with the index on "
            "scheduled is listed (LadderProducer(channel, index=True), Scheduler.on(connection, index=True), Celery's "
            "ladder_index = True); 'kombu-ladder status' shows the rung depths") in err
    code, out, err = _cli(backend, index, "waiting", "list", "--json", capsys=capsys)  # the same on stderr
    assert code == 0 and "4 message(s) wait in the ladder that the index does not list" in err
    with backend.connection() as conn:
        _schedule(conn, backend, 1, start=3)
    code, out, err = _cli(backend, index, "waiting", "list", capsys=capsys)
    assert code == 0 and "4 message(s) wait" in err  # one more indexed, as many unindexed
    code, out, err = _cli(backend, index, "waiting", "list", "--no-sync", capsys=capsys)
    assert code == 0 and "the index does not list" not in err  # no broker asked: nothing to compare with


def test_waiting_list_of_an_indexed_ladder_says_nothing_more(backend: SimulatorBackend, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with backend.connection() as conn:
        declare_target(conn, "t.index")
        _schedule(conn, backend, 5)
    code, out, err = _cli(backend, tmp_path / "index.sqlite", "waiting", "list", capsys=capsys)
    assert code == 0 and len(out.splitlines()) == 6 and "does not list" not in err
