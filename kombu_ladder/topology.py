"""Declare the ladder: the exchange, the five rungs, the control and parking queues."""

from __future__ import annotations

import logging
from typing import Any

from amqp.exceptions import PreconditionFailed
from kombu import Exchange, Queue

from .contract import CONTROL, EXCHANGE, EXCHANGE_TYPE, PARKING, RUNGS, arguments_for, rung_name
from .errors import TopologyConflict

__all__ = ["declare", "ladder_exchange", "ladder_queues", "parking_queue"]

logger = logging.getLogger(__name__)


def ladder_exchange() -> Exchange:
    """Return the ``acemq.schedule`` exchange: direct and durable."""
    return Exchange(EXCHANGE, type=EXCHANGE_TYPE, durable=True, auto_delete=False)


def ladder_queues() -> list[Queue]:
    """Return the rung queues, longest first, then the control queue.

    Each is bound to ``acemq.schedule`` with its own name as the routing key.
    """
    exchange = ladder_exchange()
    queues = [
        Queue(rung_name(r), exchange, routing_key=rung_name(r), durable=True,
              auto_delete=False, queue_arguments=arguments_for(r))
        for r in RUNGS
    ]
    queues.append(Queue(CONTROL, exchange, routing_key=CONTROL, durable=True, auto_delete=False))
    return queues


def parking_queue() -> Queue:
    """Return the parking queue: durable, bound to nothing, read by operators."""
    return Queue(PARKING, exchange=None, durable=True, auto_delete=False, no_declare=False)


def declare(connection_or_channel: Any) -> list[str]:
    """Declare the ladder's exchange and queues with exactly the contract's arguments.

    Idempotent. The parking queue (local to this library) is declared too but
    is not part of the returned list, which mirrors the AceMQ ``declare``.

    Arguments:
        connection_or_channel: a :class:`kombu.Connection` or a channel.

    Returns:
        The queue names, longest rung first and the control queue last.

    Raises:
        TopologyConflict: a queue or the exchange exists with other arguments.
    """
    if hasattr(connection_or_channel, "default_channel"):
        # A channel of our own: a PRECONDITION_FAILED closes the channel it hit,
        # and must not leave the caller's default channel dead.
        channel = connection_or_channel.channel()
        try:
            return _declare_on(channel)
        finally:
            _close_quietly(channel)
    return _declare_on(connection_or_channel)


def _close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - the channel may already be closed by the broker
        logger.debug("closing the declare channel failed", exc_info=True)


def _declare_on(channel: Any) -> list[str]:
    exchange = ladder_exchange()
    try:
        exchange(channel).declare()
    except PreconditionFailed as exc:
        raise TopologyConflict(EXCHANGE, {"type": EXCHANGE_TYPE, "durable": True}, str(exc)) from exc
    names = []
    for queue in [*ladder_queues(), parking_queue()]:
        try:
            queue(channel).declare()
        except PreconditionFailed as exc:
            expected = {"durable": True, "arguments": getattr(queue, "queue_arguments", None) or {}}
            raise TopologyConflict(queue.name, expected, str(exc)) from exc
        names.append(queue.name)
    logger.debug("declared the ladder topology: %s", ", ".join(names))
    return names[:-1]
