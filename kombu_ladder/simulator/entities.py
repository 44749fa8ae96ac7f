"""The broker's entities: exchanges with their routing rules, queues with their arguments, stored messages."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from amqp import spec
from amqp.exceptions import PreconditionFailed

__all__ = [
    "EXCHANGE_TYPES",
    "QUEUE_ARGUMENT_KEYS",
    "Stored",
    "Binding",
    "SimExchange",
    "SimQueue",
    "ConsumerRef",
    "topic_matches",
    "headers_match",
    "check_queue_arguments",
    "check_equivalent",
]

#: The exchange types the simulator routes.
EXCHANGE_TYPES = frozenset({"direct", "topic", "fanout", "headers"})

#: Queue arguments RabbitMQ 3.10 compares when a queue is declared again; any
#: other argument is accepted and ignored, as RabbitMQ does.
QUEUE_ARGUMENT_KEYS: tuple[str, ...] = (
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
    "x-queue-type", "x-quorum-initial-group-size", "x-delivery-limit", "x-queue-master-locator",
    "x-queue-leader-locator", "x-initial-cluster-size", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-dead-letter-strategy",
)

_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")
_seq = itertools.count(1)


@dataclass
class Stored:
    """One message in one queue (each queue a message is routed to holds its own copy)."""

    body: bytes
    #: AMQP properties as a consumer reads them (``application_headers`` included).
    properties: dict[str, Any]
    #: The exchange and routing key it was published (or dead-lettered) with.
    exchange: str
    routing_key: str
    #: Position in the queue: a requeued message goes back to where it was.
    seq: int = field(default_factory=lambda: next(_seq))
    #: Virtual epoch ms at which it expires at the head of the queue (None: never).
    expires_at: Optional[int] = None
    redelivered: bool = False
    #: Its properties encoded, exactly as published (or as dead-lettering rewrote them).
    raw: bytes = b"\x00\x00"
    #: What py-amqp raises decoding ``raw`` (RabbitMQ took it; ``properties`` is then lenient).
    undecodable: Optional[BaseException] = None
    #: Virtual epoch ms at which a stream appended it (None: not in a stream).
    appended_at: Optional[int] = None

    @property
    def headers(self) -> dict[str, Any]:
        """The application headers (an empty dict when there are none)."""
        return self.properties.get("application_headers") or {}


@dataclass(frozen=True)
class Binding:
    """A binding from an exchange to a queue (or, with ``to_exchange``, to another exchange)."""

    destination: str
    routing_key: str
    arguments: tuple[tuple[str, Any], ...] = ()
    to_exchange: bool = False


@dataclass
class SimExchange:
    """A declared exchange."""

    name: str
    type: str
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)

    def matches(self, binding: Binding, routing_key: str, headers: dict[str, Any]) -> bool:
        """Whether a message with ``routing_key`` and ``headers`` follows ``binding``."""
        if self.type == "fanout":
            return True
        if self.type == "topic":
            return topic_matches(binding.routing_key, routing_key)
        if self.type == "headers":
            return headers_match(dict(binding.arguments), headers)
        return binding.routing_key == routing_key


@dataclass
class ConsumerRef:
    """A consumer on a queue: its channel, tag, ack mode and prefetch window."""

    channel: Any
    tag: str
    no_ack: bool
    prefetch: int = 0  #: 0 means unlimited
    exclusive: bool = False
    unacked: int = 0
    #: A stream consumer's next offset in its queue's log (None on a classic queue).
    offset: Optional[int] = None

    def has_capacity(self) -> bool:
        """Whether the consumer (and its channel's global window) can take one more."""
        if self.channel.closed:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        limit = self.channel.global_prefetch
        return not limit or len(self.channel.unacked) < limit


@dataclass
class SimQueue:
    """A declared (classic) queue."""

    name: str
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    owner: Any = None  #: the connection of an exclusive queue
    ready: "deque[Stored]" = field(default_factory=deque)
    consumers: list[ConsumerRef] = field(default_factory=list)
    had_consumers: bool = False
    #: A stream's records (see :mod:`~kombu_ladder.simulator.streams`); empty for a classic queue.
    log: list[Stored] = field(default_factory=list)
    _next: int = 0

    @property
    def ttl(self) -> Optional[int]:
        """The queue's ``x-message-ttl`` in ms, or None."""
        return self.arguments.get("x-message-ttl")

    def next_consumer(self) -> Optional[ConsumerRef]:
        """Return the next consumer with room for a message, round robin."""
        count = len(self.consumers)
        for i in range(count):
            ref = self.consumers[(self._next + i) % count]
            if ref.has_capacity():
                self._next = (self._next + i + 1) % count
                return ref
        return None

    def requeue(self, message: Stored) -> None:
        """Put ``message`` back at its original position, marked redelivered."""
        message.redelivered = True
        index = len(self.ready)
        while index and self.ready[index - 1].seq > message.seq:
            index -= 1
        self.ready.insert(index, message)

    def over_limit(self, extra: int = 0, extra_bytes: int = 0) -> bool:
        """Whether the ready messages (plus ``extra``) exceed ``x-max-length``/``-bytes``."""
        limit = self.arguments.get("x-max-length")
        if limit is not None and len(self.ready) + extra > limit:
            return True
        limit = self.arguments.get("x-max-length-bytes")
        return limit is not None and sum(len(m.body) for m in self.ready) + extra_bytes > limit


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Topic exchange matching: ``*`` is exactly one word, ``#`` zero or more."""
    return _topic(pattern.split("."), routing_key.split("."))


def _topic(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_topic(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _topic(rest, words[1:])


def headers_match(arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    """Headers exchange matching with ``x-match`` = all (default), any, all-with-x or any-with-x."""
    mode = arguments.get("x-match", "all")
    with_x = mode.endswith("-with-x")
    wanted = {k: v for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))}
    if not wanted:
        return mode.startswith("all")
    hits = [k in headers and (v is None or headers[k] == v) for k, v in wanted.items()]
    return all(hits) if mode.startswith("all") else any(hits)


def _fail(text: str, method: Any) -> PreconditionFailed:
    return PreconditionFailed(f"PRECONDITION_FAILED - {text}", method, reply_code=406)


def _int_arg(queue: str, vhost: str, key: str, value: Any, *, minimum: int) -> None:
    where = f"invalid arg '{key}' for queue '{queue}' in vhost '{vhost}'"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f'{where}: "expected integer, got {_type_name(value)}"', spec.Queue.Declare)
    if value < minimum:
        raise _fail(f"{where}: {{value_{'negative' if value < 0 else 'zero'},{value}}}", spec.Queue.Declare)


def check_queue_arguments(queue: str, vhost: str, arguments: dict[str, Any]) -> None:
    """Refuse the queue arguments RabbitMQ 3.10 refuses, with its PRECONDITION_FAILED text."""
    for key, minimum in (("x-message-ttl", 0), ("x-expires", 1), ("x-max-length", 0),
                         ("x-max-length-bytes", 0), ("x-max-priority", 0)):
        if key in arguments:
            _int_arg(queue, vhost, key, arguments[key], minimum=minimum)
    for key in ("x-dead-letter-exchange", "x-dead-letter-routing-key"):
        if key in arguments and not isinstance(arguments[key], str):
            raise _fail(f"invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': "
                        f'"expected longstr, got {_type_name(arguments[key])}"', spec.Queue.Declare)
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise _fail(f"invalid arg 'x-dead-letter-routing-key' for queue '{queue}' in vhost '{vhost}': "
                    "routing_key_but_no_dlx_defined", spec.Queue.Declare)
    if "x-overflow" in arguments and arguments["x-overflow"] not in _OVERFLOW:
        raise _fail(f"invalid arg 'x-overflow' for queue '{queue}' in vhost '{vhost}': "
                    f"{{unknown_overflow_value,{arguments['x-overflow']!r}}}", spec.Queue.Declare)


def _type_name(value: Any) -> str:
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _type_class(value: Any) -> str:
    name = _type_name(value)
    return "integer" if name in ("signedint", "long") else name


def _render(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"'{str(value).lower()}'"
    return f"the value '{value}' of type '{_type_name(value)}'"


def check_equivalent(kind: str, name: str, vhost: str, current: dict[str, Any],
                     received: dict[str, Any], method: Any) -> None:
    """Raise PRECONDITION_FAILED when a redeclaration differs where RabbitMQ compares.

    ``current`` and ``received`` map setting names (``durable``, ``type``,
    queue argument keys...) to values; only the keys present in ``current``
    are compared.
    """
    for key, have in current.items():
        got = received.get(key)
        if have == got and _type_class(have) == _type_class(got):
            continue
        if have is not None and got is not None:
            text = f"received '{_plain(got)}' but current is '{_plain(have)}'"
        else:
            text = f"received {_render(got)} but current is {_render(have)}"
        raise _fail(f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': {text}", method)


def _plain(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
