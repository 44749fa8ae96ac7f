"""cancel(): record a cancellation durably in the ``ladder.cancellations`` stream (confirmed)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Callable, Iterable, Optional, Union

from kombu import Producer

from .brokers import clock_of
from .cancels import STREAM, STREAM_ARGUMENTS, check_id, encode
from .carry import waiting_for_confirms
from .plan import to_millis

__all__ = ["cancel", "cancel_many", "declare_stream"]

logger = logging.getLogger(__name__)

I_CANCELLED = "recorded the cancellation of message %r (due %s) in %s"

#: A due time: an aware datetime, or epoch milliseconds.
Due = Union[datetime, int, None]


def declare_stream(channel: Any) -> None:
    """Declare the cancellation stream on ``channel`` (durable, retention past the longest delay)."""
    channel.queue_declare(queue=STREAM, durable=True, auto_delete=False, arguments=dict(STREAM_ARGUMENTS))


def _due_ms(due: Due) -> Optional[int]:
    if due is None:
        return None
    if isinstance(due, datetime):
        return to_millis(due, argument="due")
    if isinstance(due, int) and not isinstance(due, bool) and due >= 0:
        return due
    raise TypeError(f"due must be an aware datetime or epoch milliseconds, not {due!r}")


def cancel_many(connection: Any, message_ids: Iterable[str], *, due: Due = None,
                clock: Optional[Callable[[], float]] = None, key: str = "message_id") -> int:
    """Record the cancellation of every id in ``message_ids``; return how many, once all are confirmed.

    Arguments:
        connection: a :class:`kombu.Connection` (RabbitMQ, or the simulator).
        message_ids: AMQP message ids (a Celery task's id is its message's id).
        due: the messages' due time, when known: an aware datetime or epoch ms. A record
            with a due time is forgotten a day after it; one without, after the longest delay.
        clock: epoch seconds, for the record's timestamp (default: the wall clock, or the
            simulator's virtual clock on a ``ladder-sim://`` connection).
        key: ``"message_id"``, or ``"task_id"`` for Celery task ids (matched against a task
            message's ``correlation_id``, where Celery puts the id).

    Raises:
        TypeError, ValueError: an id that cannot be an AMQP message id, or a bad ``due``.
    """
    ids = [check_id(message_id) for message_id in message_ids]
    clock = clock_of(connection, clock)
    due_ms = _due_ms(due)
    if not ids:
        return 0
    channel = connection.channel()
    try:
        declare_stream(channel)
        waiting_for_confirms(channel)
        producer = Producer(channel, routing_key=STREAM, auto_declare=False)
        for message_id in ids:
            body = encode(message_id, at=int(clock() * 1000), due=due_ms, key=key)
            producer.publish(body, routing_key=STREAM, content_type="application/json",
                             content_encoding="utf-8", delivery_mode=2)
            logger.info(I_CANCELLED, message_id, "unknown" if due_ms is None else due_ms, STREAM)
    finally:
        try:
            channel.close()
        except Exception:  # noqa: BLE001 - a dead connection has nothing to close
            logger.debug("closing the cancellation channel failed", exc_info=True)
    return len(ids)


def cancel(connection: Any, message_id: str, *, due: Due = None,
           clock: Optional[Callable[[], float]] = None) -> None:
    """Record the cancellation of ``message_id``; return once the broker confirmed it.

    Every relay, including one started later, drops the message when it next
    reaches it (at a hop or at delivery). See :func:`cancel_many` for the arguments.
    """
    cancel_many(connection, [message_id], due=due, clock=clock)
