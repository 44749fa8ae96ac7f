"""cancel(): record a cancellation durably in the ``ladder.cancellations`` stream (confirmed)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Callable, Iterable, Optional, Union

from kombu import Producer

from ..carry import waiting_for_confirms
from ..controlplane import declare_control_plane
from ..controlplane.codec import encode as encode_record
from ..controlplane.codec import pack_ids
from ..controlplane.writer import CONFIRM_TIMEOUT, WriteRefused, write_bodies
from ..errors import CancellationsUnavailable
from ..link import clock_of, close_quietly
from ..plan import to_millis
from .records import STREAM, STREAM_ARGUMENTS, STREAM_EXCHANGE, check_id

__all__ = ["cancel", "cancel_many", "declare_stream", "declare_cancellations", "CancellationsUnavailable",
           "CONFIRM_TIMEOUT"]

logger = logging.getLogger(__name__)

I_CANCELLED = "recorded a cancellation for id %r (due %s) in %s"
I_DECLARED = "the exchange %s %s; declared the control plane, and recorded the cancellations"
E_UNAVAILABLE = ("cannot record cancellations: the exchange {exchange} {problem}. A canceller needs write on "
                 "{exchange} (kombu_ladder.permissions.canceller), and the operator declares the exchange and "
                 "binds it with 'kombu-ladder declare' (or 'celery ladder declare')")

#: Reply codes of a publish to the exchange that leave the old way to try: the exchange is missing, not
#: bound (the record was returned), or not this user's to write.
_NOT_SET_UP = {404: "does not exist", 312: "is not bound to the stream (the record was returned unrouted)",
               403: "may not be written by this user"}

#: A due time: an aware datetime, or epoch milliseconds.
Due = Union[datetime, int, None]


def declare_stream(channel: Any) -> None:
    """Declare the cancellation stream on ``channel`` (durable, retention past the longest delay)."""
    channel.queue_declare(queue=STREAM, durable=True, auto_delete=False, arguments=dict(STREAM_ARGUMENTS))


def declare_cancellations(connection_or_channel: Any) -> None:
    """Declare the control plane (:func:`~kombu_ladder.controlplane.declare_control_plane`): the stream, the
    exchange cancellers publish to (:data:`~kombu_ladder.cancellation.records.STREAM_EXCHANGE`) and its
    binding, with the other kinds'. What the operator's ``declare`` sets up. On a channel of its own when
    given a :class:`kombu.Connection`."""
    if hasattr(connection_or_channel, "default_channel"):
        channel = connection_or_channel.channel()
        try:
            return declare_control_plane(channel)
        finally:
            close_quietly(channel)
    declare_control_plane(connection_or_channel)


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
    """Record a cancellation for every id in ``message_ids``; return how many ids, once all are confirmed.

    The ids go in batch records of up to 1,000 ids (and 64 KiB) each
    (:func:`~kombu_ladder.controlplane.codec.pack_ids`), confirms pipelined. A cancellation
    applies to whichever message with its id is waiting when it is written: one whose AMQP
    ``message_id`` is the id, or a Celery task message whose task id is. Every
    relay drops that message at its next hop or delivery. A message scheduled later with
    the same id is not cancelled (see :ref:`how-cancel`). Whether a message with the id is
    waiting is not checked: the count is of ids recorded, not of messages cancelled.

    Arguments:
        connection: a :class:`kombu.Connection` (RabbitMQ, or the simulator).
        message_ids: AMQP message ids or Celery task ids.
        due: the messages' due time, when known: an aware datetime or epoch ms. A record
            with a due time is forgotten a day after it, if that is sooner than a day and
            an hour after it was written (:data:`~kombu_ladder.cancellation.records.LIFE`).
        clock: epoch seconds, for the record's timestamp (default: the wall clock, or the
            simulator's virtual clock on a ``ladder-sim://`` connection).
        key: what the caller means the ids as: ``"message_id"``, or ``"task_id"`` for Celery
            task ids (which Celery sends as a task message's ``correlation_id``). Relays of this
            release match both whatever it says; older ones match only the one named.

    The records go to the exchange ``ladder.record.cancel``, bound to the stream by the operator's
    ``declare``: writing to it is all a canceller needs, and the only way a relay accepts a cancellation.
    Where it does not exist yet, or is not bound, the control plane is declared first when this user
    may (a user with full rights, as on a development broker), and the records are sent again.

    Raises:
        TypeError, ValueError: an id that cannot be an AMQP message id, or a bad ``due``.
        CancellationsUnavailable: neither way is open to this user.
    """
    ids = [check_id(message_id) for message_id in message_ids]
    clock = clock_of(connection, clock)
    due_ms = _due_ms(due)
    if not ids:
        return 0
    bodies = [encode_record(record) for record in pack_ids(ids, at=int(clock() * 1000), due=due_ms, key=key)]
    channel = waiting_for_confirms(connection.channel())
    try:
        try:  # the first record tells whether the exchange is set up
            _publish(channel, STREAM_EXCHANGE, bodies[:1])
        except connection.channel_errors as exc:
            problem = _NOT_SET_UP.get(getattr(exc, "reply_code", 0))
            if problem is None:
                raise
            close_quietly(channel)
            channel = waiting_for_confirms(connection.channel())
            if getattr(exc, "reply_code", 0) == 403:
                raise CancellationsUnavailable(E_UNAVAILABLE.format(exchange=STREAM_EXCHANGE,
                                                                    problem=problem)) from None
            try:
                declare_control_plane(channel)
            except connection.channel_errors as refused:
                raise CancellationsUnavailable(E_UNAVAILABLE.format(
                    exchange=STREAM_EXCHANGE, problem=f"{problem} and this user may not declare it "
                    f"({getattr(refused, 'reply_text', None) or refused})")) from None
            logger.info(I_DECLARED, STREAM_EXCHANGE, problem)
            _publish_pipelined(connection, bodies)
        else:
            _publish_pipelined(connection, bodies[1:])
    finally:
        close_quietly(channel)
    for message_id in ids:  # one line an id, whatever the records: the trail an operator greps
        logger.info(I_CANCELLED, message_id, "unknown" if due_ms is None else due_ms, STREAM)
    return len(ids)


def _publish_pipelined(connection: Any, bodies: list[bytes], *, timeout: float = CONFIRM_TIMEOUT) -> None:
    """Publish the records through the one writer (confirms pipelined).

    Raises:
        CancellationsUnavailable: the broker nacked or returned a record, or did not confirm them in ``timeout``.
    """
    try:
        write_bodies(connection, STREAM_EXCHANGE, STREAM, bodies, timeout=timeout)
    except WriteRefused as exc:
        raise CancellationsUnavailable(f"cancellation records: {exc}") from None


def _publish(channel: Any, exchange: str, bodies: list[bytes]) -> None:
    """Publish each record to ``exchange`` (the stream's name as routing key), mandatory, each confirmed."""
    producer = Producer(channel, routing_key=STREAM, auto_declare=False)
    for body in bodies:
        producer.publish(body, exchange=exchange, routing_key=STREAM, content_type="application/json",
                         content_encoding="utf-8", delivery_mode=2, mandatory=True)


def cancel(connection: Any, message_id: str, *, due: Due = None,
           clock: Optional[Callable[[], float]] = None) -> None:
    """Record a cancellation for ``message_id`` (a message id or a Celery task id); return once confirmed.

    Every relay, including one started later, drops the message with that id
    waiting now when it next reaches it (at a hop or at delivery); one scheduled
    later with the same id is delivered. See :func:`cancel_many` for the arguments.
    """
    cancel_many(connection, [message_id], due=due, clock=clock)
