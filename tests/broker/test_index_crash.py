"""Issue 35: a producer killed right after ``publish`` returns has its message in the index."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import vhost_url
from kombu import Connection

from kombu_ladder import declare
from kombu_ladder.cancellation.stream import declare_cancellations
from kombu_ladder.index import IndexStore, sync

pytestmark = pytest.mark.broker

#: Publishes with the index on, says so on stdout, then waits to be killed (SIGKILL: no exit handler, no flush).
PRODUCER = textwrap.dedent("""
    import sys, time
    from kombu import Connection
    from kombu_ladder import LadderProducer

    with Connection(sys.argv[1]) as conn:
        producer = LadderProducer(conn.channel(), index=True)
        for i in range(int(sys.argv[2])):
            producer.publish(b"{}", exchange="", routing_key="crash.q", countdown=3600, message_id=f"crash-{i}")
        print("returned", flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("count", [1, 7])
def test_a_producer_killed_right_after_publish_returns_has_its_messages_in_the_index(
        fresh_vhost: str, count: int) -> None:
    url = vhost_url(fresh_vhost)
    with Connection(url) as admin:
        declare(admin)
        declare_cancellations(admin)
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, url, str(count)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "returned"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    store = IndexStore(":memory:")
    with Connection(url) as reader:
        result = sync(reader, store)
    assert result.entries == count
    for i in range(count):
        (row,) = store.find(f"crash-{i}", 0)
        assert row.entry.routing_key == "crash.q"
