"""Kombu quickstart: retry later, with Scheduler.republish.

Run it with RabbitMQ on localhost (or set BROKER_URL, or pass a URL)::

    python examples/kombu_republish.py [amqp://guest:guest@localhost//]
"""

from __future__ import annotations

import os
import sys
import time

from kombu import Connection, Consumer, Queue

from kombu_ladder import Scheduler, republish_count

BROKER_URL = os.environ.get("BROKER_URL", "amqp://guest:guest@localhost//")

work = Queue("republish-work", routing_key="republish-work")


class TemporaryFailure(Exception):
    """The job cannot be done now (a service is down): try it again later."""


def handle(body: dict, tries: int) -> None:
    """Do the job; this one fails twice, as a flaky service would."""
    if tries < 2:
        raise TemporaryFailure(f"service unavailable for job {body['job']}")


def main(broker_url: str = BROKER_URL) -> list[str]:
    """Fail a job twice, retry it 1 s and 2 s later; return what happened."""
    log: list[str] = []

    def note(text: str) -> None:
        log.append(f"{time.monotonic() - started:4.1f}s  {text}")
        print(log[-1])

    with Connection(broker_url) as conn, Scheduler.on(conn) as scheduler:

        def on_message(body: dict, message) -> None:
            tries = republish_count(message)
            try:
                handle(body, tries)
                message.ack()
                note(f"done after {tries} retries")
            except TemporaryFailure as exc:
                if tries >= 5:
                    message.reject()  # give up: dead-letter or drop it
                    note(f"gave up: {exc}")
                else:
                    delay = 2**tries  # 1 s, 2 s, 4 s...
                    scheduler.republish(message, delay, queue=work.name)
                    note(f"{exc}; retry in {delay}s")

        with Consumer(conn, queues=[work], callbacks=[on_message],
                      accept=["json"]):
            with conn.Producer(serializer="json") as producer:
                started = time.monotonic()  # the clock starts with the job
                producer.publish({"job": 7}, routing_key=work.name,
                                 declare=[work])
            while not log or "retry in" in log[-1]:
                conn.drain_events(timeout=30)
    return log


if __name__ == "__main__":
    main(*sys.argv[1:2])
