"""Kombu quickstart: LadderProducer, a kombu.Producer with countdown= and eta=.

Run it with RabbitMQ on localhost (or set BROKER_URL, or pass a URL)::

    python examples/kombu_producer.py [amqp://guest:guest@localhost//]

In production the relay is a process of its own (``kombu-ladder relay``, or
the Celery workers); here it runs in a thread to keep the script whole.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import datetime, timedelta, timezone

from kombu import Connection, Exchange, Queue

from kombu_ladder import LadderProducer, Relay

BROKER_URL = os.environ.get("BROKER_URL", "amqp://guest:guest@localhost//")

billing = Exchange("billing", type="direct")
invoices = Queue("invoices", billing, routing_key="invoice.due")


def main(broker_url: str = BROKER_URL) -> list[dict]:
    """Publish three invoices, two for later; return them in arrival order."""
    with Connection(broker_url) as conn:
        queue = conn.SimpleQueue(invoices)  # declares billing and invoices

        relay = Relay(conn.clone())  # what `kombu-ladder relay` runs
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        relay.ready.wait(30)

        producer = LadderProducer(conn.default_channel, serializer="json")
        producer.publish({"invoice": 42}, exchange=billing,
                         routing_key="invoice.due", countdown=5)
        in_2s = datetime.now(timezone.utc) + timedelta(seconds=2)
        producer.publish({"invoice": 43}, exchange=billing,
                         routing_key="invoice.due", eta=in_2s)
        producer.publish({"invoice": 44}, exchange=billing,
                         routing_key="invoice.due")  # no delay: as usual

        arrived = []
        for _ in range(3):
            message = queue.get(timeout=30)
            print(message.payload, message.content_type)
            arrived.append(message.payload)
            message.ack()

        relay.stop()
        thread.join(10)
        relay.connection.release()
        queue.close()
    return arrived


if __name__ == "__main__":
    main(*sys.argv[1:2])
