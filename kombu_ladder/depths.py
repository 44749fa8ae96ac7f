"""How many messages wait in each of the ladder's queues, and who consumes them."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from .contract import CONTROL, PARKING, rung_names

__all__ = ["QueueDepth", "queue_depths", "waiting_in_queues", "LADDER_QUEUES"]

#: Every queue the ladder uses: the rungs longest first, the control queue, the parking queue.
LADDER_QUEUES: tuple[str, ...] = (*rung_names(), CONTROL, PARKING)


class QueueDepth(NamedTuple):
    """One queue's depth; ``None`` counts mean the queue does not exist."""

    #: The queue's name.
    queue: str
    #: Messages ready in it.
    messages: Optional[int]
    #: Its consumers.
    consumers: Optional[int]


def queue_depths(connection: Any) -> list[QueueDepth]:
    """Return the depth and consumers of every rung, the control queue and the parking queue.

    Each queue is asked passively on a channel of its own, so a missing queue
    (reported with ``None`` counts) does not stop the others from being read.

    Arguments:
        connection: a connected :class:`kombu.Connection`.

    Returns:
        One :class:`QueueDepth` per queue of :data:`LADDER_QUEUES`, in that order.
    """
    rows = []
    for name in LADDER_QUEUES:
        channel = connection.channel()
        try:
            _, messages, consumers = channel.queue_declare(name, passive=True)
            rows.append(QueueDepth(name, int(messages), int(consumers)))
        except connection.channel_errors:
            rows.append(QueueDepth(name, None, None))
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - the broker closed it on a missing queue
                pass
    return rows


def waiting_in_queues(connection: Any) -> int:
    """Messages waiting in the rungs and the control queue (a missing queue counts none; parked ones are not
    waiting)."""
    return sum(row.messages or 0 for row in queue_depths(connection) if row.queue != PARKING)
