"""Pure message rules: what a scheduled message carries, and where one expiry goes (addresses, no bytes)."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from .carry import text_of
from .contract import (
    CONTENT_TYPE,
    DUE_AT,
    MESSAGE_TYPE,
    SCHEDULE_HEADERS,
    TARGET_EXCHANGE,
    TARGET_ROUTING_KEY,
    rung_name,
)
from .plan import DELIVER, MAX_DELAY, Step, choose_rung, parse_due_at, relay_step
from .targets import is_internal, name_problem, own_name_problem
from .text import escape, quote
from .wire import PROPERTIES, Unencodable, py_property, py_table, py_value

__all__ = [
    "ORIGINAL_DELIVERY_MODE",
    "REFUSALS",
    "LOCAL_HEADERS",
    "MAX_REASON",
    "DEATH_HEADER",
    "DEATH_PREFIXES",
    "Deliver",
    "Hold",
    "Hop",
    "Park",
    "Decision",
    "scheduled_headers",
    "scheduled_content_header",
    "strip_death",
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

#: The most characters of a parking reason.
MAX_REASON = 1000

#: RabbitMQ's dead-lettering bookkeeping: this header, and every header with one of these prefixes.
DEATH_HEADER = "x-death"
DEATH_PREFIXES: tuple[str, ...] = ("x-first-death-", "x-last-death-")

_U16 = struct.Struct(">H").pack
_U32 = struct.Struct(">I").pack


@dataclass(frozen=True)
class Deliver:
    """Publish the message to its target now: exchange ``exchange``, routing key ``routing_key``."""

    exchange: str
    routing_key: str
    #: Its ``x-schedule-due-at`` (epoch ms).
    due_at: int


@dataclass(frozen=True)
class Hold(Deliver):
    """Deliver the message at ``due_at``: the relay keeps it unacked until then."""


@dataclass(frozen=True)
class Hop:
    """Put the message back into rung ``rung`` (seconds)."""

    rung: int
    #: It fell within the hold window but the relay had no room to hold it (not part of equality).
    unheld: bool = field(default=False, compare=False)

    @property
    def queue(self) -> str:
        """The rung's queue."""
        return rung_name(self.rung)


@dataclass(frozen=True)
class Park:
    """Park the message in the parking queue because of ``reason`` (escaped, at most :data:`MAX_REASON`
    characters: it quotes what the message held)."""

    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", escape(self.reason, limit=MAX_REASON))


Decision = Union[Deliver, Hold, Hop, Park]


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


#: Headers :func:`scheduled_headers` writes: a publisher's own copy of one is left to py-amqp's encoder.
_WRITTEN = frozenset((*SCHEDULE_HEADERS, ORIGINAL_DELIVERY_MODE))

_BIT = {name: bit for name, bit, _ in PROPERTIES}

#: A publisher's own properties of a rung message, in wire order: those before ``type``, and after it.
_OWN_BEFORE_TYPE = ("correlation_id", "reply_to", "message_id", "timestamp")
_OWN_AFTER_TYPE = ("user_id", "app_id", "cluster_id")
_OWN = frozenset((*_OWN_BEFORE_TYPE, *_OWN_AFTER_TYPE))


@functools.lru_cache(maxsize=1024)
def _schedule_items(exchange: str, routing_key: str, content_type: Optional[str],
                    delivery_mode: Optional[int]) -> tuple[bytes, bytes]:
    """The encoded ``x-schedule-*`` items of one target: those before the due time's value, and after it."""
    ours = scheduled_headers(None, exchange=exchange, routing_key=routing_key, due_at=0,
                             content_type=content_type, delivery_mode=delivery_mode)
    names = list(ours)
    due = names.index(DUE_AT)
    return (py_table({name: ours[name] for name in names[:due]}) + bytes((len(DUE_AT),)) + DUE_AT.encode(),
            py_table({name: ours[name] for name in names[due + 1:]}))


@functools.lru_cache(maxsize=256)
def _fixed_properties(content_type: Optional[str], content_encoding: Optional[str],
                      priority: Optional[int]) -> tuple[int, bytes, bytes]:
    """The rung message's flags and encoded properties besides the table and the publisher's own:
    those before the header table (content type and encoding) and those after it (delivery mode, priority)."""
    flags = _BIT["application_headers"] | _BIT["delivery_mode"] | _BIT["type"]
    head: list[bytes] = []
    middle = [py_property("delivery_mode", 2)]
    for name, value, chunks in (("content_type", content_type, head), ("content_encoding", content_encoding, head),
                                ("priority", priority, middle)):
        if value is not None:
            chunks.append(py_property(name, value))
            flags |= _BIT[name]
    return flags, b"".join(head), b"".join(middle)


_TYPE = py_property("type", MESSAGE_TYPE)


def _own(properties: Mapping[str, Any], names: tuple[str, ...]) -> tuple[int, bytes]:
    flags, chunks = 0, []
    for name in names:
        value = properties.get(name)
        if value is not None:
            chunks.append(py_property(name, value))
            flags |= _BIT[name]
    return flags, b"".join(chunks)


def scheduled_content_header(
    headers: Mapping[str, Any],
    properties: Mapping[str, Any],
    *,
    exchange: str,
    routing_key: str,
    due_at: int,
    content_type: Optional[str],
    content_encoding: Optional[str],
    delivery_mode: Optional[int],
    priority: Any,
) -> Optional[bytes]:
    """Return the encoded properties of a message waiting in a rung, byte for byte as py-amqp writes them.

    They are those of ``amqp.Message(priority=priority, content_type=..., content_encoding=...,
    application_headers=scheduled_headers(headers, ...), delivery_mode=2, type=MESSAGE_TYPE,
    **properties)``; what repeats from one message to the next is encoded once. None when
    py-amqp must encode them itself: a value of a type or size only it handles, a header
    :func:`scheduled_headers` writes already among ``headers``, or a property besides the
    basic class's own.
    """
    if not _WRITTEN.isdisjoint(headers) or not _OWN.issuperset(properties):
        return None
    try:
        flags, head, middle = _fixed_properties(content_type, content_encoding, priority)
        before, after = _schedule_items(exchange, routing_key, content_type, delivery_mode)
        table = py_table(headers) + before + py_value(int(due_at)) + after
        if not properties:
            return _U16(flags) + head + _U32(len(table)) + table + middle + _TYPE
        flags_before, own_before = _own(properties, _OWN_BEFORE_TYPE)
        flags_after, own_after = _own(properties, _OWN_AFTER_TYPE)
        return (_U16(flags | flags_before | flags_after) + head + _U32(len(table)) + table + middle + own_before
                + _TYPE + own_after)
    except (Unencodable, TypeError):  # TypeError: an unhashable content type or priority (py-amqp refuses it)
        return None


def is_death_header(name: Any) -> bool:
    """Whether a header ``name`` (str, or bytes when it is not UTF-8) is RabbitMQ's dead-lettering bookkeeping."""
    return isinstance(name, str) and (name == DEATH_HEADER or name.startswith(DEATH_PREFIXES))


def strip_death(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``headers`` without RabbitMQ's dead-lettering bookkeeping."""
    return {k: v for k, v in headers.items() if not is_death_header(k)}


def delivered_content_type(headers: Mapping[str, Any]) -> Optional[str]:
    """The content type ``x-schedule-content-type`` restores on delivery (a library that parks bytes as
    ``application/octet-stream`` still delivers them as what they are), or None to keep the property."""
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
    now_ms: int,
    *,
    allow_exchange: Optional[Callable[[str], bool]] = None,
    max_delay_ms: int = MAX_DELAY * 1000,
    hold_window_ms: Optional[int] = None,
    can_hold: bool = False,
) -> Decision:
    """Decide where one expired message goes: delivered (now or held until due), into a rung, or parked.

    Only addresses come back; the bytes are built by whoever publishes
    (:mod:`kombu_ladder.relay.outgoing`).

    Arguments:
        headers: the message's application headers (``None`` when it had none).
        now_ms: the relay's clock, in epoch milliseconds.
        allow_exchange: optional predicate; a target exchange it refuses is parked.
        max_delay_ms: a due time further ahead than this is parked as malformed
            (a unit mistake); the default is :data:`~kombu_ladder.plan.MAX_DELAY`.
        hold_window_ms: None (the default) for the contract's rung rule
            (:func:`~kombu_ladder.plan.choose_rung`); a relay gives its hold window, and its
            rule is :func:`~kombu_ladder.plan.relay_step`.
        can_hold: whether the relay has room to hold this message now (a value: the
            decision reads nothing of the relay's state; the relay acts on the verdict).

    Returns:
        :class:`Deliver`, :class:`Hold`, :class:`Hop` or :class:`Park`.
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
    own = own_name_problem(exchange, routing_key)
    if own is not None:
        return Park(f"refused: target {own[1]}")
    problem = _content_type_problem(headers)
    if problem is not None:
        return Park(f"malformed: {problem}")
    if allow_exchange is not None and not allow_exchange(exchange):
        return Park(f"refused: target exchange {quote(exchange)} is not in the relay's allow-list")

    remaining = due - now_ms
    step: Step
    if hold_window_ms is None:
        step = choose_rung(remaining)
    else:
        step = relay_step(remaining, hold_window_ms=hold_window_ms, can_hold=can_hold)
    if isinstance(step, int):
        # within the window but not held (no room): the relay learns it from the verdict
        return Hop(step, unheld=hold_window_ms is not None and 0 < remaining < hold_window_ms and not can_hold)
    return Deliver(exchange, routing_key, due) if step is DELIVER else Hold(exchange, routing_key, due)
