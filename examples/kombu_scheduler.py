"""Kombu quickstart: deliver messages later with the Scheduler (the AceMQ API).

Run it with RabbitMQ on localhost (or give a broker URL)::

    python examples/kombu_scheduler.py [amqp://guest:guest@localhost//]
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone

from kombu import Connection, Queue

from kombu_ladder import Scheduler


def main(broker_url: str = "amqp://guest:guest@localhost//") -> list[str]:
    """Schedule three reminders with mixed delays; return them in arrival order.

    Accuracy is about one second, early rather than late (see "How it works").
    """
    arrived = []
    with Connection(broker_url) as conn:
        reminders = conn.SimpleQueue(Queue("reminders", routing_key="reminders"))
        # Scheduler.on declares the ladder and runs a relay in a background thread.
        with Scheduler.on(conn) as scheduler:
            # Longest first: the short ones still overtake it.
            scheduler.in_(8, "eight seconds", routing_key="reminders")  # to the default exchange
            scheduler.in_(timedelta(seconds=1), "one second", routing_key="reminders")
            scheduler.at(datetime.now(timezone.utc) + timedelta(seconds=4), "four seconds",
                         routing_key="reminders")
            started = time.monotonic()
            for _ in range(3):
                message = reminders.get(timeout=30)
                print(f"{time.monotonic() - started:5.1f}s  {message.payload}")
                arrived.append(message.payload)
                message.ack()
            print(scheduler)  # Scheduler{rungs=1h, 10m, 1m, 10s, 1s, scheduled=3, delivered=...}
        reminders.close()
    return arrived


if __name__ == "__main__":
    main(*sys.argv[1:2])
