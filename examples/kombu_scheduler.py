"""Kombu quickstart: deliver messages later with the Scheduler (AceMQ API).

Run it with RabbitMQ on localhost (or set BROKER_URL, or pass a URL)::

    python examples/kombu_scheduler.py [amqp://guest:guest@localhost//]
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timedelta, timezone

from kombu import Connection, Queue

from kombu_ladder import Scheduler

BROKER_URL = os.environ.get("BROKER_URL", "amqp://guest:guest@localhost//")


def main(broker_url: str = BROKER_URL) -> list[str]:
    """Schedule three reminders; return them in arrival order.

    Each arrives at its due time: the relay holds a message's last seconds
    and delivers it then.
    """
    arrived = []
    with Connection(broker_url) as conn:
        queue = Queue("reminders", routing_key="reminders")
        reminders = conn.SimpleQueue(queue)
        # Declares the ladder and runs a relay in a background thread.
        with Scheduler.on(conn) as scheduler:
            # Longest first: the short ones still overtake it.
            scheduler.in_(8, "eight seconds", routing_key="reminders")
            scheduler.in_(timedelta(seconds=1), "one second",
                          routing_key="reminders")
            in_4s = datetime.now(timezone.utc) + timedelta(seconds=4)
            scheduler.at(in_4s, "four seconds", routing_key="reminders")

            started = time.monotonic()
            for _ in range(3):
                message = reminders.get(timeout=30)
                elapsed = time.monotonic() - started
                print(f"{elapsed:5.1f}s  {message.payload}")
                arrived.append(message.payload)
                message.ack()
        print(scheduler)  # closed: its relay has settled every confirm
        reminders.close()
    return arrived


if __name__ == "__main__":
    main(*sys.argv[1:2])
