"""The cost of ``kombu-ladder find`` on a rung of 100,000 waiting messages, and that it disturbs nothing.

Run: ``python -m bench.find_scan [N]`` (needs RabbitMQ; uses a private vhost). Prints the figures.
"""

from __future__ import annotations

import subprocess
import sys
import time

from kombu_ladder import LadderProducer, declare
from kombu_ladder.contract import rung_name
from kombu_ladder.peek import find

from .common import Vhost, log, queue_depth, wait_until

#: The rung the messages wait in: 40 minutes ahead is the 10m rung.
COUNTDOWN = 2400
RUNG = rung_name(600)


def main(n: int = 100_000) -> None:
    with Vhost("find-scan") as vhost, vhost.connection() as conn:
        declare(conn)
        producer = LadderProducer(conn.default_channel)
        started = time.monotonic()
        for i in range(n):
            producer.publish(b"x" * 600, exchange="", routing_key="target", countdown=COUNTDOWN, message_id=f"m-{i}")
        wait_until(lambda: queue_depth(conn, RUNG)[0] == n, timeout=120)
        log(f"published {n} messages in {time.monotonic() - started:.1f} s")
        for label, ident in (("the last message", f"m-{n - 1}"), ("an id that is not there", "absent")):
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "kombu_ladder", "--broker", vhost.url, "find", ident],
                                  capture_output=True, text=True)
            wall = time.monotonic() - started
            log(f"kombu-ladder find, {label}: exit {done.returncode}, {wall:.2f} s wall; "
                f"{(done.stdout or done.stderr).strip().splitlines()[-1]}")
        result = find(conn, f"m-{n // 2}")
        log(f"find() of the middle message in-process: {result.seconds:.2f} s, looked at {result.looked_at}")
        assert queue_depth(conn, RUNG)[0] == n
        channel = conn.channel()
        order = []
        while (message := channel.basic_get(RUNG, no_ack=True)) is not None:
            order.append(message.properties["message_id"])
        channel.close()
        log(f"after three scans: {len(order)} messages, order unchanged: {order == [f'm-{i}' for i in range(n)]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
