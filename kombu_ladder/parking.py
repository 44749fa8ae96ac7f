"""The parking queue: see why messages were parked, and send them back through the relay."""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from typing import Any, Collection, Optional

from .carry import bytes_of, confirming, prepare_copy, text_of
from .contract import CONTROL, EXCHANGE, PARKED_AT, PARKED_REASON, PARKING
from .envelope import REFUSALS

__all__ = ["PARKED_ID", "RAW_PROPERTIES", "ReplayResult", "Parked", "parked_reasons", "parked_messages", "replay",
           "discard", "unparked_headers"]

logger = logging.getLogger(__name__)

#: Header on a parked message: an id unique to that parking (local to this library).
PARKED_ID = "x-ladder-parked-id"

#: Header on a parked message whose properties no client could read (not UTF-8, nested too
#: deep, a timestamp past the year 9999...): those properties, as the bytes that arrived.
RAW_PROPERTIES = "x-ladder-raw-properties"

#: Headers a replay removes: the parking's own, and the count of refused deliveries (a replayed
#: message gets its retries afresh).
_UNPARKED = (PARKED_REASON, PARKED_AT, PARKED_ID, REFUSALS)

I_REPLAYED = "replayed %d parked message(s) to %s; %d left parked"
I_DISCARDED = "deleted the parked message %s"


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay` did."""

    #: Parked messages sent back to the control queue (each confirmed, then removed).
    replayed: int
    #: Parked messages looked at and left in the parking queue (not matching, or over the limit).
    kept: int


@dataclass(frozen=True)
class Parked:
    """One parked message as :func:`parked_messages` saw it (every field from the message: untrusted)."""

    #: Its place in the parking queue (1 is the head).
    position: int
    #: Its ``x-ladder-parked-id`` (None: parked by RabbitMQ itself, or by an older relay).
    parked_id: Optional[str]
    #: Why it was parked.
    reason: str
    #: Its headers and properties as they arrived, and its body's bytes.
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: bytes


def unparked_headers(headers: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Return a parked message's headers without the parking headers.

    The ``x-schedule-*`` headers it had when it was parked stay, so the relay
    decides about it again exactly as it did the first time.
    """
    return {k: v for k, v in (headers or {}).items() if k not in _UNPARKED}


#: The reason of a message RabbitMQ itself parked: the quorum profile's control queue dead-letters
#: to the parking queue a message that spent its delivery limit (relay crashes, lost connections).
DELIVERY_LIMIT_REASON = ("delivery_limit: RabbitMQ moved it here from {queue} once it had been handed to relays "
                         "more times than the queue's delivery limit allows (quorum profile)")


def _last_death(headers: dict[str, Any]) -> dict[str, Any]:
    """The newest death a broker wrote (4.x: ``x-last-death-*``; 3.x: the first table of ``x-death``)."""
    deaths = headers.get("x-death")
    newest = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
    return {"reason": text_of(headers.get("x-last-death-reason", newest.get("reason"))),
            "queue": text_of(headers.get("x-last-death-queue", newest.get("queue")))}


def _reason(message: Any) -> str:
    headers = message.headers or {}
    if PARKED_REASON not in headers:
        death = _last_death(headers)
        if death["reason"] == "delivery_limit":
            return DELIVERY_LIMIT_REASON.format(queue=death["queue"] or CONTROL)
    reason = headers.get(PARKED_REASON, "")
    text = text_of(reason)
    return text if text is not None else repr(reason)


def _depth(channel: Any) -> int:
    return int(channel.queue_declare(PARKING, passive=True)[1])


def parked_reasons(connection: Any, *, limit: int = 100) -> list[tuple[str, int]]:
    """Tally the reasons of the first ``limit`` parked messages, most frequent first.

    The messages are only looked at: they are taken unacked and returned to
    their places when the channel closes.

    Arguments:
        connection: a :class:`kombu.Connection`.
        limit: how many parked messages to look at.

    Returns:
        ``(reason, count)`` pairs.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a non-negative integer, not {limit!r}")
    tally: collections.Counter[str] = collections.Counter()
    channel = connection.channel()
    try:
        for _ in range(min(limit, _depth(channel))):
            message = channel.basic_get(PARKING, no_ack=False)
            if message is None:
                break
            tally[_reason(message)] += 1
    finally:
        channel.close()  # the broker puts every unacked message back in its place
    return tally.most_common()


def parked_messages(connection: Any, *, limit: int = 100) -> list[Parked]:
    """Return the first ``limit`` parked messages, head first, with why each was parked.

    As :func:`parked_reasons`, the messages are only looked at: taken unacked, and
    returned to their places when the channel closes.

    Raises:
        ValueError: ``limit`` is not a non-negative integer.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a non-negative integer, not {limit!r}")
    found = []
    channel = connection.channel()
    try:
        for position in range(1, min(limit, _depth(channel)) + 1):
            message = channel.basic_get(PARKING, no_ack=False)
            if message is None:
                break
            headers = dict(message.headers or {})
            found.append(Parked(position, text_of(headers.get(PARKED_ID)), _reason(message), headers,
                                dict(message.properties or {}), bytes_of(message.body)))
    finally:
        channel.close()  # the broker puts every unacked message back in its place
    return found


def _selected(message: Any, match: Optional[str], reason: Optional[str], ids: Optional[Collection[str]]) -> bool:
    if ids is not None and text_of((message.headers or {}).get(PARKED_ID)) not in ids:
        return False
    why = _reason(message) if match is not None or reason is not None else ""
    return (match is None or match in why) and (reason is None or reason == why)


def replay(connection: Any, *, limit: Optional[int] = None, match: Optional[str] = None, reason: Optional[str] = None,
           ids: Optional[Collection[str]] = None) -> ReplayResult:
    """Send parked messages back to the control queue, where the relay decides again.

    Run it after fixing what parked them (declare the missing exchange or
    binding, extend the allow-list): a message that is due is then delivered,
    one that is not yet due goes back into a rung, and one that still cannot be
    delivered is parked again with a fresh reason. Each message is removed from
    the parking queue only once the broker confirmed its copy, so a crash
    duplicates rather than loses. Only the messages parked when the replay
    starts are looked at, once each.

    Arguments:
        connection: a :class:`kombu.Connection` (py-amqp transport).
        limit: replay at most this many (default: all).
        match: replay only messages whose ``x-ladder-parked-reason`` contains this text.
        reason: replay only messages parked for exactly this reason (one group of :func:`parked_reasons`).
        ids: replay only messages with one of these ``x-ladder-parked-id`` values.

    Returns:
        A :class:`ReplayResult`.

    Raises:
        ValueError: ``limit`` is not a non-negative integer.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
    replayed = kept = 0
    channel = connection.channel()
    try:
        confirming(channel)
        for _ in range(_depth(channel)):
            message = channel.basic_get(PARKING, no_ack=False)
            if message is None:
                break
            if not _selected(message, match, reason, ids) or (limit is not None and replayed >= limit):
                kept += 1  # left unacked: it goes back to its place when the channel closes
                continue
            _send_back(channel, message)
            channel.basic_ack(message.delivery_tag)
            replayed += 1
    finally:
        channel.close()
    logger.info(I_REPLAYED, replayed, CONTROL, kept)
    return ReplayResult(replayed=replayed, kept=kept)


def discard(connection: Any, parked_id: str) -> bool:
    """Delete the parked message whose ``x-ladder-parked-id`` is ``parked_id``; return whether one was found.

    The parking queue is looked at once, head first; the message is acked (the broker
    drops it) and every other one goes back to its place.
    """
    channel = connection.channel()
    try:
        for _ in range(_depth(channel)):
            message = channel.basic_get(PARKING, no_ack=False)
            if message is None:
                break
            if text_of((message.headers or {}).get(PARKED_ID)) == parked_id:
                channel.basic_ack(message.delivery_tag)
                logger.info(I_DISCARDED, parked_id)
                return True
    finally:
        channel.close()
    return False


def _send_back(channel: Any, message: Any) -> None:
    copy = prepare_copy(channel, message.body, message.properties or {}, unparked_headers(message.headers))
    # Waits for the broker's confirm; a nack raises, and the parked original stays.
    channel.basic_publish_confirm(copy, exchange=EXCHANGE, routing_key=CONTROL, mandatory=True)
