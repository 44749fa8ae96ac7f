"""Pure message rules: what a scheduled message carries and what one expiry becomes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from .carry import CARRIED_PROPERTIES, carried, text_of
from .contract import (
    CONTENT_TYPE,
    DUE_AT,
    MESSAGE_TYPE,
    SCHEDULE_HEADERS,
    TARGET_EXCHANGE,
    TARGET_ROUTING_KEY,
    rung_name,
)
from .plan import MAX_DELAY, parse_due_at, place
from .targets import is_internal, name_problem
from .text import escape, quote

__all__ = [
    "ORIGINAL_DELIVERY_MODE",
    "REFUSALS",
    "LOCAL_HEADERS",
    "CARRIED_PROPERTIES",
    "Deliver",
    "Hop",
    "Park",
    "Decision",
    "scheduled_headers",
    "scheduled_properties",
    "strip_death",
    "strip_for_delivery",
    "delivery_properties",
    "delivered_content_type",
    "delivered_mode",
    "is_death_header",
    "decide",
]

#: Local header (not part of the AceMQ contract): the publisher's own delivery
#: mode, written only when it asked for a transient message. Rung messages are
#: always persistent; delivery restores what the publisher asked for.
ORIGINAL_DELIVERY_MODE = "x-ladder-delivery-mode"

#: Local header (not part of the AceMQ contract): how many times the broker refused
#: (nacked) the delivery of this message. Written on the retry hop of a refused
#: delivery, so retries stay bounded across relays; stripped on delivery.
REFUSALS = "x-ladder-refusals"

#: Headers local to this library that a rung message may carry and a delivery never does.
LOCAL_HEADERS: tuple[str, ...] = (ORIGINAL_DELIVERY_MODE, REFUSALS)

_DEATH_PREFIXES = ("x-first-death-", "x-last-death-")


@dataclass(frozen=True)
class Deliver:
    """Publish to the target now, with these headers and properties."""

    exchange: str
    routing_key: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    #: Its ``x-schedule-due-at`` (epoch ms): a relay that holds it publishes it then (issue 14).
    due_at: int = 0


@dataclass(frozen=True)
class Hop:
    """Put the message back into a rung (``rung`` seconds, queue ``queue``)."""

    rung: int
    queue: str
    headers: dict[str, Any]
    properties: dict[str, Any]


@dataclass(frozen=True)
class Park:
    """Park the message in the parking queue because of ``reason``."""

    reason: str


Decision = Union[Deliver, Hop, Park]


def scheduled_headers(
    headers: Optional[Mapping[str, Any]],
    *,
    exchange: str,
    routing_key: str,
    due_at: int,
    content_type: Optional[str],
    delivery_mode: Optional[int] = None,
) -> dict[str, Any]:
    """Return the application headers plus the four ``x-schedule-*`` headers."""
    out = dict(headers or {})
    out[TARGET_EXCHANGE] = exchange
    out[TARGET_ROUTING_KEY] = routing_key
    out[DUE_AT] = int(due_at)
    out[CONTENT_TYPE] = content_type or "application/octet-stream"
    if delivery_mode is not None and delivery_mode != 2:
        out[ORIGINAL_DELIVERY_MODE] = int(delivery_mode)
    return out


def scheduled_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Return the AMQP properties of a message waiting in a rung.

    The carried properties stay; ``type`` becomes ``ScheduledMessage``, delivery
    is persistent, and there is never a per-message ``expiration``.
    """
    out = carried(properties)
    out["type"] = MESSAGE_TYPE
    out["delivery_mode"] = 2
    return out


def is_death_header(name: Any) -> bool:
    """Whether a header ``name`` (str, or bytes when it is not UTF-8) is RabbitMQ's dead-lettering bookkeeping."""
    return isinstance(name, str) and (name == "x-death" or name.startswith(_DEATH_PREFIXES))


def strip_death(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``headers`` without RabbitMQ's dead-lettering bookkeeping."""
    return {k: v for k, v in headers.items() if not is_death_header(k)}


def strip_for_delivery(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return the application headers alone: no ``x-schedule-*``, local or death headers."""
    out = strip_death(headers)
    for key in (*SCHEDULE_HEADERS, *LOCAL_HEADERS):
        out.pop(key, None)
    return out


def delivery_properties(headers: Mapping[str, Any], properties: Mapping[str, Any]) -> dict[str, Any]:
    """Return the AMQP properties of the delivered message.

    The content type comes back from ``x-schedule-content-type`` (a library that
    parks bytes as ``application/octet-stream`` still delivers them as what
    they are), and the delivery mode from the publisher's own choice.
    """
    out = carried(properties)
    content_type = delivered_content_type(headers)
    if content_type is not None:
        out["content_type"] = content_type
    out["delivery_mode"] = delivered_mode(headers)
    if properties.get("type") not in (None, MESSAGE_TYPE):
        out["type"] = properties["type"]
    return out


def delivered_content_type(headers: Mapping[str, Any]) -> Optional[str]:
    """The content type ``x-schedule-content-type`` restores on delivery, or None to keep the property."""
    return text_of(headers.get(CONTENT_TYPE)) or None


def delivered_mode(headers: Mapping[str, Any]) -> int:
    """The delivery mode a delivery restores: the publisher's (``x-ladder-delivery-mode``), else persistent."""
    mode = headers.get(ORIGINAL_DELIVERY_MODE)
    return mode if mode in (1, 2) and not isinstance(mode, bool) else 2


def _shown(value: Any) -> str:
    """A header value as a parking reason quotes it: its repr, escaped and bounded."""
    return escape(repr(value))


def _content_type_problem(headers: Mapping[str, Any]) -> Optional[str]:
    value = headers.get(CONTENT_TYPE)
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if not isinstance(value, bytes):
        return None  # absent or not text: the message's own content_type property is delivered
    if len(value) > 255:
        return f"header {CONTENT_TYPE} is {len(value)} bytes, longer than a content type can be (255)"
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return f"header {CONTENT_TYPE} is not valid UTF-8: {_shown(value)}"
    return None


def decide(
    headers: Optional[Mapping[str, Any]],
    properties: Mapping[str, Any],
    now_ms: int,
    *,
    allow_exchange: Optional[Callable[[str], bool]] = None,
    max_delay_ms: int = MAX_DELAY * 1000,
    plan: Callable[[int, int], Optional[int]] = place,
) -> Decision:
    """Decide what one expired message becomes: a delivery, a hop or a parking.

    Arguments:
        headers: the message's application headers (``None`` when it had none).
        properties: its AMQP properties, as a plain mapping.
        now_ms: the relay's clock, in epoch milliseconds.
        allow_exchange: optional predicate; a target exchange it refuses is parked.
        max_delay_ms: a due time further ahead than this is parked as malformed
            (a unit mistake); the default is :data:`~kombu_ladder.plan.MAX_DELAY`.
        plan: ``plan(due_at_ms, now_ms)`` gives the rung or None (deliver); the
            default is :func:`~kombu_ladder.plan.place`, the contract's rule.

    Returns:
        :class:`Deliver`, :class:`Hop` or :class:`Park`.
    """
    if not isinstance(headers, Mapping) or not headers:
        return Park("malformed: the message has no headers (not a scheduled message)")
    if DUE_AT not in headers:
        return Park(f"malformed: header {DUE_AT} is missing")
    due = parse_due_at(headers[DUE_AT])
    if due is None:
        return Park(f"malformed: header {DUE_AT} is not an integer of epoch ms: {_shown(headers[DUE_AT])}")
    if due < 0:
        return Park(f"malformed: header {DUE_AT} is negative: {due}")
    if due - now_ms > max_delay_ms:
        return Park(f"malformed: header {DUE_AT}={due} is more than the relay's max_delay of "
                    f"{max_delay_ms // 1000}s ahead (a due time in microseconds?)")
    if TARGET_EXCHANGE not in headers:
        return Park(f"malformed: header {TARGET_EXCHANGE} is missing")
    exchange = text_of(headers[TARGET_EXCHANGE], strict=True)
    if exchange is None:
        return Park(f"malformed: header {TARGET_EXCHANGE} is not a string: {_shown(headers[TARGET_EXCHANGE])}")
    if TARGET_ROUTING_KEY not in headers:
        return Park(f"malformed: header {TARGET_ROUTING_KEY} is missing")
    routing_key = text_of(headers[TARGET_ROUTING_KEY], strict=True)
    if routing_key is None:
        return Park(
            f"malformed: header {TARGET_ROUTING_KEY} is not a string: {_shown(headers[TARGET_ROUTING_KEY])}"
        )
    if not exchange and not routing_key:
        return Park(f"malformed: header {TARGET_ROUTING_KEY} is empty for the default exchange")
    for header, what, name in ((TARGET_EXCHANGE, "exchange", exchange),
                               (TARGET_ROUTING_KEY, "routing key", routing_key)):
        problem = name_problem(what, name)
        if problem is not None:
            return Park(f"malformed: header {header}: the target {problem}")
    if is_internal(exchange):
        return Park(f"unroutable: target exchange {quote(exchange)} is internal to RabbitMQ, "
                    f"which refuses every publish to it")
    problem = _content_type_problem(headers)
    if problem is not None:
        return Park(f"malformed: {problem}")
    if allow_exchange is not None and not allow_exchange(exchange):
        return Park(f"refused: target exchange {quote(exchange)} is not in the relay's allow-list")

    rung = plan(due, now_ms)
    if rung is None:
        return Deliver(
            exchange=exchange,
            routing_key=routing_key,
            headers=strip_for_delivery(headers),
            properties=delivery_properties(headers, properties),
            due_at=due,
        )
    return Hop(
        rung=rung,
        queue=rung_name(rung),
        headers=strip_death(headers),
        properties=scheduled_properties(properties),
    )
