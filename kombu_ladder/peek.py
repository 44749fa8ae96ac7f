"""Look at waiting messages without taking them: find one by id in the rungs and the parking queue."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from amqp.channel import Channel as AmqpChannel
from amqp.exceptions import ChannelError
from kombu import Consumer, Queue

from .cancellation.records import STREAM, LiveSet, read_from
from .carry import text_of
from .contract import CONTROL, DUE_AT, PARKED_REASON, PARKING, TARGET_EXCHANGE, TARGET_ROUTING_KEY, rung_names
from .controlplane.codec import Cancel
from .controlplane.reader import ReadError, StreamMissing, read_to_end
from .link import clock_of
from .plan import parse_due_at

__all__ = ["Sighting", "Progress", "FindResult", "SCANNED_QUEUES", "DEFAULT_LIMIT", "find", "matches", "peek",
           "sighting_of", "live_cancellations", "state_of"]

#: Where :func:`find` looks, in this order: the rungs longest first (a message only ever moves to a
#: shorter or the same rung, so one that moves during a scan moves ahead of it), then the control queue
#: (what expired during the scan, and what ``move`` put there before a relay placed it), then the
#: parking queue.
SCANNED_QUEUES: tuple[str, ...] = (*rung_names(), CONTROL, PARKING)

#: How many messages :func:`find` looks at, at most, over all the queues.
DEFAULT_LIMIT = 200_000

#: Seconds without a delivery after which a queue's ready count is asked (0: all of it is in hand).
IDLE = 0.25


@dataclass(frozen=True)
class Sighting:
    """A waiting message that matched, where it waits and what it is waiting for."""

    #: The queue it waits in.
    queue: str
    #: Its place in that queue (1 is the head, the next to expire).
    position: int
    #: Messages in that queue when the scan started.
    depth: int
    #: Its due time, epoch milliseconds (None when its x-schedule-due-at is unreadable).
    due_at: Optional[int]
    #: Where it will be delivered.
    exchange: Any
    routing_key: Any
    #: The AMQP message id, and the Celery task id and name, when it has them.
    message_id: Optional[str]
    task_id: Optional[str]
    task: Optional[str]
    #: Why it was parked, for a message in the parking queue.
    parked_reason: Optional[str]


@dataclass(frozen=True)
class Progress:
    """How far a scan has got: passed to a progress callback about once a second."""

    queue: str
    looked_at: int
    depth: int


@dataclass(frozen=True)
class FindResult:
    """What :func:`find` saw."""

    #: The matching messages, in scan order.
    found: tuple[Sighting, ...]
    #: Messages looked at, in all queues.
    looked_at: int
    #: Seconds the scan took.
    seconds: float
    #: Whether the scan stopped at ``limit`` before looking at every message.
    truncated: bool


def matches(ident: str, headers: Mapping[str, Any], properties: Mapping[str, Any]) -> bool:
    """Whether a message has ``ident`` as its message id, correlation id or Celery task id (``id`` header)."""
    return ident in (text_of(properties.get("message_id")), text_of(properties.get("correlation_id")),
                     text_of(headers.get("id")))


def _sighting(queue: str, position: int, depth: int, headers: Mapping[str, Any],
              properties: Mapping[str, Any]) -> Sighting:
    return Sighting(
        queue=queue, position=position, depth=depth,
        due_at=parse_due_at(headers.get(DUE_AT)) if DUE_AT in headers else None,
        exchange=text_of(headers.get(TARGET_EXCHANGE)), routing_key=text_of(headers.get(TARGET_ROUTING_KEY)),
        message_id=text_of(properties.get("message_id")), task_id=text_of(headers.get("id")),
        task=text_of(headers.get("task")), parked_reason=text_of(headers.get(PARKED_REASON)),
    )


def sighting_of(queue: str, position: int, depth: int, message: Any) -> Sighting:
    """The :class:`Sighting` of ``message`` (as :func:`peek` shows it) at ``position`` of ``queue``."""
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    return _sighting(queue, position, depth, headers, getattr(message, "properties", None) or {})


def peek(connection: Any, queue: str, visit: Callable[[int, Any], bool], *, limit: int,
         progress: Optional[Callable[[Progress], None]] = None,
         settle: Optional[Callable[[Any], None]] = None) -> tuple[int, int]:
    """Show each message of ``queue`` to ``visit(position, message)``, head first, and put them all back.

    The messages are consumed unacknowledged on a channel of their own, which is then
    closed: RabbitMQ gives every one back at its place, so the queue's order and count
    are unchanged (checked on RabbitMQ 3.10 with 100,000 messages). While held, a message
    cannot expire: one whose TTL passes meanwhile expires as soon as the channel closes,
    late by at most the time this queue's scan took.

    Arguments:
        connection: a connected :class:`kombu.Connection`.
        queue: the queue to look into (it must exist).
        visit: called with each message's 1-based position and the kombu message; returning
            True stops the scan there.
        limit: look at this many messages at most.
        progress: called about once a second with a :class:`Progress`.
        settle: called with the scan's channel once the scan stopped, before the channel is
            closed: what it acks there (the message ``visit`` stopped at, say) is taken, and
            every other message goes back. If it raises, nothing it did uncommitted is kept.

    Returns:
        ``(looked_at, depth)``: messages looked at, and the queue's depth when the scan started.
    """
    channel = connection.channel()
    seen = 0
    stop = False
    try:
        depth = int(channel.queue_declare(queue, passive=True)[1])
        if not depth or limit <= 0:
            return 0, depth

        def on_message(message: Any) -> None:
            nonlocal seen, stop
            if stop:
                return  # in hand already, given back with the rest
            seen += 1
            stop = bool(visit(seen, message)) or seen >= limit

        cancel = _consume(channel, queue, on_message)
        shown = time.monotonic()
        while not stop and seen < depth:
            try:
                connection.drain_events(timeout=IDLE)
            except (socket.timeout, TimeoutError):
                if not int(channel.queue_declare(queue, passive=True)[1]):
                    break  # every message left is in hand: the others expired before their turn
            if progress is not None and time.monotonic() - shown >= 1.0:
                shown = time.monotonic()
                progress(Progress(queue, seen, depth))
        stop = True
        cancel()  # the deliveries still on their way arrive before the cancel's reply, and are ignored
        if settle is not None:
            settle(channel)
        _give_back(channel, queue)
        return seen, depth
    finally:
        try:
            channel.close()  # the broker puts every unacked message back at its place (after an error)
        except Exception:  # noqa: BLE001 - closed by the broker already (a missing queue): nothing is held
            pass


def _give_back(channel: Any, queue: str) -> None:
    """Put every message in hand back at its place, and return once ``queue`` has them again.

    Closing the channel gives them back too, but the queue learns of the close after the
    channel has answered it: a scan that follows at once (the next find, the next
    reschedule) can find the queue short of them, and miss the message it looks for (a
    read right after the close came short about once in a hundred, on RabbitMQ 4.0 and
    3.10). ``basic.recover``
    hands them back to the queue before it replies, and a passive declare on the same
    channel is answered by the queue after it has them.
    """
    if not isinstance(channel, AmqpChannel):
        return  # the simulator gives them back as the channel closes
    try:
        channel.basic_recover(requeue=True)
        channel.queue_declare(queue, passive=True)
    except ChannelError:
        pass  # the queue is gone (deleted during the scan): the channel is closed, nothing is held


class _Raw:
    """A py-amqp message seen as a kombu one (``headers``, ``properties``, ``body``, ``delivery_tag``),
    without kombu's decoding."""

    __slots__ = ("headers", "properties", "body", "delivery_tag")

    def __init__(self, message: Any) -> None:
        self.properties = message.properties
        self.headers = message.properties.get("application_headers") or {}
        self.body = message.body
        self.delivery_tag = message.delivery_tag


def _consume(channel: Any, queue: str, on_message: Callable[[Any], None]) -> Callable[[], None]:
    """Consume ``queue`` unacked, unlimited prefetch; return how to cancel.

    On py-amqp the raw messages are read, which is about four times as fast as
    building kombu messages; other transports (the simulator) go through kombu.
    """
    if isinstance(channel, AmqpChannel):
        tag = channel.basic_consume(queue, callback=lambda message: on_message(_Raw(message)), no_ack=False)
        return lambda: channel.basic_cancel(tag)
    consumer = Consumer(channel, queues=[Queue(queue, no_declare=True)], on_message=on_message, no_ack=False)
    consumer.consume()
    return consumer.cancel


def find(connection: Any, ident: str, *, limit: int = DEFAULT_LIMIT, first: bool = True,
         queues: tuple[str, ...] = SCANNED_QUEUES,
         progress: Optional[Callable[[Progress], None]] = None,
         take: Optional[Callable[[Any, Any], None]] = None) -> FindResult:
    """Find the waiting messages whose message id, correlation id or Celery task id is ``ident``.

    Each queue is looked at with :func:`peek`, so nothing is taken, reordered or lost
    (unless ``take`` takes the match). A message at a relay (taken from
    ``acemq.schedule.due``, not yet in its next queue) at the moment its queue is looked
    at is not seen.

    Arguments:
        connection: a connected :class:`kombu.Connection`.
        ident: the id to look for.
        limit: look at this many messages at most, over all the queues.
        first: stop at the first match.
        queues: where to look, in order.
        progress: called about once a second on a long scan.
        take: called with the scan's channel and the first match, still held unacked
            on it, before that channel closes (see :func:`peek`'s ``settle``); only with
            ``first``.

    Returns:
        A :class:`FindResult`.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive integer, not {limit!r}")
    if take is not None and not first:
        raise ValueError("take needs first=True: it takes the first match")
    found: list[Sighting] = []
    looked_at = 0
    truncated = False
    started = time.monotonic()
    for queue in queues:
        hits: list[tuple[int, Any]] = []

        def visit(position: int, message: Any, hits: list[tuple[int, Any]] = hits) -> bool:
            headers = message.headers if isinstance(message.headers, Mapping) else {}
            if matches(ident, headers, getattr(message, "properties", None) or {}):
                hits.append((position, message))
                return first
            return False

        def settle(channel: Any, hits: list[tuple[int, Any]] = hits) -> None:
            if take is not None and hits:
                take(channel, hits[0][1])

        try:
            seen, depth = peek(connection, queue, visit, limit=limit - looked_at, progress=progress, settle=settle)
        except connection.channel_errors:
            continue  # a missing queue holds nothing
        looked_at += seen
        found += [sighting_of(queue, position, depth, message) for position, message in hits]
        if found and first:
            break
        if looked_at >= limit:
            truncated = True
            break
    return FindResult(found=tuple(found), looked_at=looked_at, seconds=time.monotonic() - started,
                      truncated=truncated)


def live_cancellations(connection: Any, *, timeout: float = 60.0) -> Optional[LiveSet]:
    """The cancellations a relay would enforce now, read from ``ladder.cancellations`` as a relay reads them (the
    records of its read-back window, up to a marker appended here); None when the stream cannot be read (refused;
    empty when it does not exist) or was not read to its end within ``timeout`` seconds. Records are untrusted: a
    bad one (or one not written through the cancel exchange) is skipped and counted."""
    clock = clock_of(connection)
    live = LiveSet()

    def on_record(record: Any, offset: Optional[int]) -> None:
        if isinstance(record, Cancel):
            now = int(clock() * 1000)
            for each in record.each():
                live.add(each, now)

    try:
        read_to_end(connection, STREAM, on_record=on_record, start=lambda: read_from(clock()), timeout=timeout,
                    clock=clock)
    except StreamMissing:
        return LiveSet()  # no stream: nothing was ever cancelled here (recording one declares it)
    except (ReadError, ChannelError, *connection.channel_errors):
        return None
    return live


def state_of(sighting: Sighting, live: Optional[LiveSet], now_ms: int) -> str:
    """``parked``, ``cancelled`` (a relay drops it at its next hop or delivery), ``waiting``, or ``waiting
    (cancellations unknown)`` when they could not be read. An id matches the message id or the Celery task id, as
    a relay matches them."""
    if sighting.queue == PARKING:
        return "parked"
    if live is None:
        return "waiting (cancellations unknown)"
    if any(live.cancelled(i, now_ms) for i in (sighting.message_id, sighting.task_id) if i):
        return "cancelled"
    return "waiting"
