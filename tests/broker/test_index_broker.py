"""The index of waiting work on RabbitMQ: producers append to the ladder.index stream, a sync reads it into SQLite."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import pytest
from helpers import drain, temporary_vhost, vhost_url, wait_for
from helpers import queue_depth as depth
from kombu import Connection, Queue

from kombu_ladder import LadderProducer, Scheduler, cancel, declare
from kombu_ladder.cancellation.stream import cancel_many
from kombu_ladder.contract import CONTROL
from kombu_ladder.index import Filter, IndexStore, sync
from kombu_ladder.index.records import STREAM
from kombu_ladder.migrate import move
from kombu_ladder.rescheduling import reschedule

pytestmark = pytest.mark.broker


def _publish(conn: Connection, n: int, *, start: int = 0) -> list[str]:
    ids = []
    producer = LadderProducer(conn.channel(), index=True)
    for i in range(start, start + n):
        ids.append(f"m-{i}")
        task = {"task": "billing.send_invoice" if i % 2 else "mail.remind", "id": f"t-{i}"}
        producer.publish(b"{}", exchange="", routing_key="index.target", countdown=3600 + i, message_id=f"m-{i}",
                         correlation_id=f"t-{i}", headers=task, content_type="application/json")
    return ids


def test_a_sync_reads_what_producers_indexed_then_only_what_is_new(fresh_vhost: str, tmp_path: object) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        declare(conn)
        Queue("index.target", durable=True)(conn.default_channel).declare()
        _publish(conn, 1500)
        store = IndexStore(str(tmp_path) + "/index.sqlite")  # type: ignore[operator]
        first = sync(conn, store)
        assert first.entries == 1500 and first.skipped == 0
        now = LadderProducer.clock() * 1000
        [row] = store.find("t-7", int(now))
        assert row.state == "waiting" and row.entry.message_id == "m-7" and row.entry.task == "billing.send_invoice"
        assert row.entry.routing_key == "index.target" and row.entry.due - row.entry.at == (3600 + 7) * 1000
        assert dict(store.count(Filter(), int(now), by="task")) == {("billing.send_invoice",): 750,
                                                                   ("mail.remind",): 750}
        _publish(conn, 10, start=1500)
        cancel_many(conn, ["t-1", "m-2"], key="task_id")
        second = sync(conn, store)
        assert second.entries == 10  # from the offset the first sync stopped at, not from the start
        now = LadderProducer.clock() * 1000
        assert store.count(Filter(), int(now)) == [((), 1508)]
        assert {store.find(i, int(now))[0].state for i in ("m-1", "t-2")} == {"cancelled"}
        next_offset, skipped = store.position(STREAM)
        assert next_offset is not None and next_offset > 0 and skipped == 0
        store.close()


def test_bulk_cancel_by_task_drops_those_tasks_and_delivers_the_rest(fresh_vhost: str, tmp_path: object,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from kombu_ladder.cli import main

    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
        Queue("index.target", durable=True)(conn.default_channel).declare()
        with Scheduler.on(conn, relay=False, index=True) as scheduler:
            for i in range(6):
                task = "billing.send_invoice" if i % 2 else "mail.remind"
                scheduler.in_(4 + i / 10, b"{}", routing_key="index.target", correlation_id=f"t-{i}",
                              headers={"task": task, "id": f"t-{i}"})
        index = str(tmp_path) + "/index.sqlite"  # type: ignore[operator]
        assert main(["--broker", url, "cancel", "--task", "billing.send_invoice", "--index", index]) == 0
        assert "recorded a cancellation for 3 id(s)" in capsys.readouterr().out
        with Scheduler.on(conn) as relay:
            wait_for(lambda: relay.delivered == 3 and relay.cancelled == 3, 60, message="3 delivered, 3 dropped")
        target = Queue("index.target", no_declare=True).bind(conn.default_channel)
        delivered = sorted(m.properties["correlation_id"] for m in iter(lambda: target.get(no_ack=True), None))
        assert delivered == ["t-0", "t-2", "t-4"]


def _schedule_tasks(conn: Connection, *ids: str, countdown: float = 7200) -> None:
    """Celery-shaped task messages ``countdown`` seconds ahead, indexed."""
    with Scheduler.on(conn, relay=False, index=True) as scheduler:
        for task_id in ids:
            scheduler.in_(countdown, b"{}", routing_key="index.target", correlation_id=task_id,
                          message_id=f"m-{task_id}", headers={"task": "billing.send_invoice", "id": task_id},
                          content_type="application/json")


def test_after_a_reschedule_and_a_run_now_the_index_shows_the_new_due_times(fresh_vhost: str, tmp_path: object) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        declare(conn)
        Queue("index.target", durable=True)(conn.default_channel).declare()
        _schedule_tasks(conn, "t-later", "t-now", "t-kept")
        store = IndexStore(str(tmp_path) + "/index.sqlite")  # type: ignore[operator]
        assert sync(conn, store).entries == 3
        old_due = store.find("t-later", int(time.time() * 1000))[0].entry.due
        with Scheduler.on(conn, relay=False) as scheduler:  # no index on this one: the reschedule writes anyway
            later = scheduler.reschedule("t-later", 600)
            now = scheduler.run_now("t-now")
        assert later.indexed and now.indexed and later.found is not None and later.found.due_at == old_due
        assert sync(conn, store).entries == 2
        now_ms = int(time.time() * 1000)
        [row] = store.find("t-later", now_ms)
        assert (row.state, row.entry.due, row.entry.was) == ("waiting", later.due_at, old_due)
        assert (row.entry.message_id, row.entry.task, row.entry.routing_key) == ("m-t-later", "billing.send_invoice",
                                                                               "index.target")
        [row] = store.find("m-t-now", now_ms)
        assert (row.state, row.entry.due) == ("due", now.due_at)
        soon = [r.entry.task_id for r in store.listing(Filter(due_before=now_ms + 900_000), now_ms)]
        assert soon == ["t-later"]  # the run-now one is due (not waiting), the kept one two hours ahead
        assert store.count(Filter(), now_ms) == [((), 2)]
        store.close()


def test_the_cli_reschedule_reaches_waiting_find(fresh_vhost: str, tmp_path: object,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from kombu_ladder.cli import main

    url = vhost_url(fresh_vhost)
    index = str(tmp_path) + "/index.sqlite"  # type: ignore[operator]
    with Connection(url) as conn:
        declare(conn)
        Queue("index.target", durable=True)(conn.default_channel).declare()
        _schedule_tasks(conn, "t-cli")
    assert main(["--broker", url, "waiting", "find", "t-cli", "--index", index, "--json"]) == 0
    [before] = json.loads(capsys.readouterr().out)["found"]
    assert main(["--broker", url, "reschedule", "t-cli", "300"]) == 0
    assert "shows the new due time from its next sync" in capsys.readouterr().out
    assert main(["--broker", url, "waiting", "find", "t-cli", "--index", index, "--json"]) == 0
    [after] = json.loads(capsys.readouterr().out)["found"]
    assert after["state"] == "waiting" and before["due_ms"] - after["due_ms"] > 6000 * 1000
    assert abs(after["due_ms"] - (time.time() + 300) * 1000) < 60_000
    assert main(["--broker", url, "run-now", "t-cli"]) == 0
    capsys.readouterr()
    assert main(["--broker", url, "waiting", "find", "t-cli", "--index", index, "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)["found"]
    assert run["state"] == "due" and run["due_ms"] <= time.time() * 1000


def test_a_reschedule_where_the_index_is_not_used_writes_no_stream(fresh_vhost: str) -> None:
    with Connection(vhost_url(fresh_vhost)) as conn:
        declare(conn)
        Queue("index.target", durable=True)(conn.default_channel).declare()
        LadderProducer(conn.default_channel).publish(b"{}", routing_key="index.target", countdown=7200,
                                                     message_id="plain")
        wait_for(lambda: depth(conn, "acemq.schedule.1h") == 1, 10, message="the publish to arrive")
        moved = reschedule(conn, "plain", 60)
        assert moved.found is not None and not moved.indexed
        channel = conn.channel()
        with pytest.raises(conn.channel_errors):
            channel.queue_declare(STREAM, passive=True)


def test_a_move_indexes_the_moved_messages_on_the_target(rabbit_vhost: str, fresh_vhost: str,
                                                         tmp_path: object) -> None:
    with temporary_vhost(f"{rabbit_vhost}-blue-{os.getpid()}") as blue_vhost, \
            Connection(vhost_url(blue_vhost)) as blue, Connection(vhost_url(fresh_vhost)) as green:
        declare(blue)
        Queue("index.target", durable=True)(blue.default_channel).declare()
        _schedule_tasks(blue, "t-moved", "t-doomed")
        _schedule_tasks(blue, "t-soon", countdown=90)
        cancel(blue, "t-doomed")
        blue_store = IndexStore(str(tmp_path) + "/blue.sqlite")  # type: ignore[operator]
        sync(blue, blue_store)
        due = {i: blue_store.find(i, int(time.time() * 1000))[0].entry.due for i in ("t-moved", "t-soon")}
        wait_for(lambda: depth(blue, "acemq.schedule.1h") == 2, 10, message="the publishes to arrive")
        result = move(blue, green)
        assert (result.total, result.indexed) == (2, 2)
        store = IndexStore(str(tmp_path) + "/green.sqlite")  # type: ignore[operator]
        assert sync(green, store).entries == 2
        now_ms = int(time.time() * 1000)
        for task_id in ("t-moved", "t-soon"):
            [row] = store.find(task_id, now_ms)
            assert (row.state, row.entry.due, row.entry.task_id, row.entry.message_id) == (
                "waiting", due[task_id], task_id, f"m-{task_id}")
            assert (row.entry.task, row.entry.exchange, row.entry.routing_key, row.entry.size) == (
                "billing.send_invoice", "", "index.target", 2)
        assert store.find("t-doomed", now_ms) == []  # dropped by the move, not indexed on green
        store.close()
        blue_store.close()


def test_a_move_from_a_broker_without_the_index_starts_none_on_the_target(rabbit_vhost: str, fresh_vhost: str) -> None:
    with temporary_vhost(f"{rabbit_vhost}-blue-{os.getpid()}") as blue_vhost, \
            Connection(vhost_url(blue_vhost)) as blue, Connection(vhost_url(fresh_vhost)) as green:
        declare(blue)
        LadderProducer(blue.default_channel).publish(b"x", routing_key="index.target", countdown=7200)
        wait_for(lambda: depth(blue, "acemq.schedule.1h") == 1, 10, message="the publish to arrive")
        result = move(blue, green)
        assert (result.total, result.indexed) == (1, 0)
        with pytest.raises(green.channel_errors):
            green.channel().queue_declare(STREAM, passive=True)


def test_a_refused_index_write_is_logged_and_the_move_goes_on(rabbit_vhost: str, fresh_vhost: str,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    import kombu_ladder.index.writer as writer

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise green.channel_errors[0](reply_text="ACCESS_REFUSED - write access to ladder.index refused")

    with temporary_vhost(f"{rabbit_vhost}-blue-{os.getpid()}") as blue_vhost, \
            Connection(vhost_url(blue_vhost)) as blue, Connection(vhost_url(fresh_vhost)) as green:
        declare(blue)
        Queue("index.target", durable=True)(blue.default_channel).declare()
        _schedule_tasks(blue, *(f"t-{i}" for i in range(5)))
        wait_for(lambda: depth(blue, "acemq.schedule.1h") == 5, 10, message="the publishes to arrive")
        monkeypatch.setattr(writer, "write_records", refuse)
        with caplog.at_level(logging.WARNING, logger="kombu_ladder.index"):
            result = move(blue, green)
        assert (result.total, result.indexed, depth(blue, "acemq.schedule.1h")) == (5, 0, 0)
        assert [m.properties["correlation_id"] for m in drain(green, CONTROL)] == [f"t-{i}" for i in range(5)]
        warnings = [r.getMessage() for r in caplog.records if r.name == "kombu_ladder.index"]
        assert any("could not append 5 index entr(y/ies)" in w and "ACCESS_REFUSED" in w for w in warnings), warnings


def test_waiting_list_reads_a_vhost_deleted_and_created_again_without_waiting(
        fresh_vhost: str, tmp_path: object, capsys: pytest.CaptureFixture[str], caplog: Any) -> None:
    """Issue 35: the local index remembers an offset of the old ladder.index; a vhost created again under the
    same URL has a new, shorter stream. ``waiting list`` notices, reads the new one from its start, and answers
    at once (it used to wait 300 s for an offset the new stream never reached, then fail)."""
    from helpers import rabbitmqctl

    from kombu_ladder.cli import main

    url = vhost_url(fresh_vhost)
    index = str(tmp_path) + "/index.sqlite"  # type: ignore[operator]

    def schedule(ids: range) -> None:
        with Connection(url) as conn:
            declare(conn)
            Queue("index.target", durable=True)(conn.default_channel).declare()
            _publish(conn, len(ids), start=ids.start)

    schedule(range(0, 40))
    assert main(["--broker", url, "waiting", "list", "--index", index]) == 0
    assert "t-39" in capsys.readouterr().out
    rabbitmqctl("delete_vhost", fresh_vhost)
    rabbitmqctl("add_vhost", fresh_vhost)
    rabbitmqctl("set_permissions", "-p", fresh_vhost, "guest", ".*", ".*", ".*")
    schedule(range(100, 103))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kombu_ladder.controlplane"):
        assert main(["--broker", url, "waiting", "list", "--index", index]) == 0
    out, _ = capsys.readouterr()
    assert time.monotonic() - started < 30
    assert all(f"t-{i}" in out for i in range(100, 103)) and "t-39" not in out, out
    assert "ladder.index was deleted and declared again" in caplog.text
