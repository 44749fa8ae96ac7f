"""``celery ladder show TASK_ID``: where a countdown task waits, found without disturbing its rung."""

from __future__ import annotations

import datetime
import re
import time

import pytest
from helpers import celery_ladder_cli, drain, vhost_url
from kombu import Connection

import celery_ladder as ladder_for_celery
from kombu_ladder.contract import rung_names
from kombu_ladder.depths import queue_depths

from .poolapp import POOL_QUEUE, make_app

pytestmark = [pytest.mark.broker, pytest.mark.celery]


def task_ids(conn: Connection, queue: str) -> list[str]:
    return [message.headers["id"] for message in drain(conn, queue)]


def test_a_countdown_task_is_shown_with_its_rung_and_due_time(fresh_vhost: str) -> None:
    url = vhost_url(fresh_vhost)
    app = ladder_for_celery.install(make_app(url))
    try:
        when = app.tasks["poolapp.when"]
        before = time.time()
        sent = [when.apply_async(countdown=600, queue=POOL_QUEUE).id for _ in range(40)]
        after = time.time()
    finally:
        app.close()
    with Connection(url) as conn:
        depths = {row.queue: row.messages for row in queue_depths(conn) if row.queue in rung_names()}
        wanted = sent[29]
        done = celery_ladder_cli(url, "show", wanted)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        shown = re.match(r"(\S+): message (\d+) of (\d+)$", lines[0])
        assert shown is not None, lines[0]
        rung, position, depth = shown.group(1), int(shown.group(2)), int(shown.group(3))
        # countdown=600 waits in the 10m rung, or in the 1m rung when a millisecond passed before it was placed.
        assert rung in (rung_names()[1], rung_names()[2]) and depth == depths[rung]
        assert lines[1] == "state   waiting"
        due = re.match(r"due     (\S+)Z, in (\d+\.\d) s$", lines[2])
        assert due is not None, lines[2]
        due_at = datetime.datetime.fromisoformat(due.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
        assert before + 600 - 0.001 <= due_at <= after + 600 + 0.001
        assert lines[3] == f"target  exchange '', routing key '{POOL_QUEUE}'"
        assert lines[4] == f"task    poolapp.when[{wanted}]"
        assert {row.queue: row.messages for row in queue_depths(conn) if row.queue in rung_names()} == depths
        waiting = {queue: task_ids(conn, queue) for queue in rung_names()}
        assert waiting[rung][position - 1] == wanted
        assert sorted(sum(waiting.values(), []), key=sent.index) == sent
        for ids in waiting.values():
            assert ids == sorted(ids, key=sent.index), "each rung's order is unchanged"
    missing = celery_ladder_cli(url, "show", "no-such-task")
    assert missing.returncode == 1 and missing.stderr.startswith("Error: no waiting message has the id 'no-such-task'")
