"""The index of waiting work on RabbitMQ: producers append to the ladder.index stream, a sync reads it into SQLite."""

from __future__ import annotations

import pytest
from helpers import vhost_url
from kombu import Connection, Queue

from kombu_ladder import LadderProducer, declare
from kombu_ladder.cancellation.stream import cancel_many
from kombu_ladder.index import Filter, IndexStore, sync
from kombu_ladder.index.records import STREAM

pytestmark = pytest.mark.broker


def _publish(conn: Connection, n: int, *, start: int = 0) -> list[str]:
    ids = []
    producer = LadderProducer(conn.channel(), index=True)
    for i in range(start, start + n):
        ids.append(f"m-{i}")
        task = {"task": "billing.send_invoice" if i % 2 else "mail.remind", "id": f"t-{i}"}
        producer.publish(b"{}", exchange="", routing_key="index.target", countdown=3600 + i, message_id=f"m-{i}",
                         correlation_id=f"t-{i}", headers=task, content_type="application/json")
    producer.flush_index()
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
    from helpers import wait_for

    from kombu_ladder import Scheduler
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
