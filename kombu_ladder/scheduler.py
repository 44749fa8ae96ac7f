"""Scheduler: the AceMQ API (``on``, ``in_``, ``at``, counters) plus delayed republish."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from types import TracebackType
from typing import Any, Callable, Iterable, Optional

from kombu.compression import compress

from .contract import ORIGINAL_ROUTING_KEY, PREFETCH, REPUBLISH_COUNT, RUNGS, describe
from .plan import MAX_DELAY, Delay, check_max_delay, delay_seconds, parse_due_at, to_millis
from .producer import LadderProducer
from .relay import Relay
from .topology import check_queue_type, declare

__all__ = ["Scheduler", "original_routing_key", "republish_count"]

logger = logging.getLogger(__name__)

#: How long :meth:`Scheduler.on` waits for its relay to start consuming.
RELAY_START_TIMEOUT = 30.0


def original_routing_key(message: Any) -> str:
    """Return the routing key a (possibly republished) message was first consumed with."""
    headers = message.headers or {}
    key = headers.get(ORIGINAL_ROUTING_KEY)
    if isinstance(key, bytes):
        key = key.decode("utf-8", "replace")
    if isinstance(key, str):
        return key
    return (message.delivery_info or {}).get("routing_key", "")


def republish_count(message: Any) -> int:
    """Return how many times ``message`` has been republished (0 for an original)."""
    count = parse_due_at((message.headers or {}).get(REPUBLISH_COUNT))
    return count if count is not None and count > 0 else 0


def _body_as_it_came(message: Any) -> Any:
    """The body bytes a consumed message arrived with.

    kombu decompresses a body with a ``compression`` header when the message is
    received; republished with that header, it must be compressed again (kombu's
    codecs are deterministic: the same bytes come back). A body kombu could not
    decompress is left as it came.
    """
    compression = (message.headers or {}).get("compression")
    if not compression or getattr(message, "errors", None):
        return message.body
    body = message.body
    return compress(body.encode("utf-8") if isinstance(body, str) else body, compression)[0]


def _confirming(channel: Any) -> Any:
    """Make every publish on ``channel`` wait for the broker's confirm, where it can."""
    confirm = getattr(channel, "basic_publish_confirm", None)
    if confirm is not None:
        channel.basic_publish = confirm
    return channel


class Scheduler:
    """Deliver messages later through the ladder.

    Use :meth:`on`: it declares the topology and, unless ``relay=False``, runs a
    relay on its own connection in a background thread. Every publish waits for
    the broker's confirm.
    """

    def __init__(
        self,
        connection: Any,
        *,
        relay: bool = True,
        clock: Callable[[], float] = time.time,
        serializer: Optional[str] = None,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        max_delay: float = MAX_DELAY,
        queue_type: str = "classic",
    ) -> None:
        self.connection = connection
        #: The queue profile: "classic" (the contract) or "quorum" (see :func:`~kombu_ladder.topology.declare`).
        self.queue_type = check_queue_type(queue_type)
        self.clock = clock
        #: The longest delay accepted (seconds), for publishing and for the relay.
        self.max_delay = check_max_delay(max_delay)
        self._scheduled = 0
        self._lock = threading.Lock()
        declare(connection, queue_type=self.queue_type)
        self._channel = _confirming(connection.channel())
        self._producer = LadderProducer(self._channel, serializer=serializer, clock=clock,
                                        max_delay=self.max_delay, queue_type=self.queue_type)
        self._relay: Optional[Relay] = None
        self._thread: Optional[threading.Thread] = None
        self._relay_connection: Any = None
        self._closed = False
        if relay:
            self._start_relay(prefetch=prefetch, allowed_exchanges=allowed_exchanges, max_delay=self.max_delay,
                              queue_type=self.queue_type)

    @classmethod
    def on(cls, connection: Any, *, relay: bool = True, **options: Any) -> "Scheduler":
        """Open a scheduler on ``connection`` with its queues declared.

        Arguments:
            connection: a :class:`kombu.Connection`.
            relay: run a relay in a background thread on a connection of its own.
            **options: ``clock``, ``serializer``, ``prefetch``, ``allowed_exchanges``,
                ``max_delay`` (seconds, default ten years), ``queue_type`` (``"classic"``,
                the default, or ``"quorum"``).

        Returns:
            The scheduler; use it as a context manager, or call :meth:`close`.
        """
        return cls(connection, relay=relay, **options)

    def _start_relay(self, **options: Any) -> None:
        self._relay_connection = self.connection.clone()
        self._relay = Relay(self._relay_connection, clock=self.clock, **options)
        self._thread = threading.Thread(target=self._relay.run, name="kombu-ladder-relay", daemon=True)
        self._thread.start()
        if not self._relay.ready.wait(RELAY_START_TIMEOUT):
            self.close()
            raise TimeoutError(f"the relay did not start consuming within {RELAY_START_TIMEOUT:g}s")

    # -- scheduling ---------------------------------------------------------

    def in_(self, delay: Delay, payload: Any, *, routing_key: str, exchange: str = "", **kwargs: Any) -> None:
        """Deliver ``payload`` after ``delay`` (seconds, or a timedelta).

        Zero or negative delivers immediately. ``**kwargs`` go to
        :meth:`kombu.Producer.publish` (``headers``, ``serializer``, properties).

        Raises:
            TypeError: ``delay`` is not a number or timedelta, or ``routing_key`` not a str.
            ValueError: ``delay`` is NaN, infinite or over ``max_delay`` (:data:`~kombu_ladder.plan.MAX_DELAY`),
                or ``routing_key`` is empty for the default exchange.
        """
        # Checked here: None would otherwise mean "no delay" to the producer.
        delay_seconds(delay, argument="delay", max_delay=self.max_delay)
        self._publish(payload, routing_key, exchange, countdown=delay, **kwargs)

    def at(self, when: datetime, payload: Any, *, routing_key: str, exchange: str = "", **kwargs: Any) -> None:
        """Deliver ``payload`` at ``when``, an aware datetime; the past delivers now.

        Raises:
            TypeError: ``when`` is not a datetime.
            ValueError: ``when`` is naive, or see :meth:`in_`.
        """
        to_millis(when, argument="when")  # None would otherwise mean "no delay" to the producer
        self._publish(payload, routing_key, exchange, eta=when, **kwargs)

    def republish(self, message: Any, delay: Delay, *, queue: str) -> int:
        """Ask for ``message`` again after ``delay``, at the back of ``queue``.

        A copy (same body, content type, headers and properties) goes through
        the ladder to ``queue`` by the default exchange; the original is acked
        only once the broker confirmed the copy. The original routing key travels
        in a header (see :func:`original_routing_key`), and the republish count
        (see :func:`republish_count`) goes up by one.

        Returns:
            The copy's republish count.
        """
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"queue must be the name of the queue to return to, not {queue!r}")
        delay_seconds(delay, argument="delay", max_delay=self.max_delay)  # None would otherwise republish at once
        headers = dict(message.headers or {})
        headers[ORIGINAL_ROUTING_KEY] = original_routing_key(message)
        count = republish_count(message) + 1
        headers[REPUBLISH_COUNT] = count
        props = message.properties or {}
        properties = {
            k: props[k] for k in ("correlation_id", "reply_to", "message_id", "priority", "app_id")
            if props.get(k) is not None
        }
        self._publish(
            _body_as_it_came(message), queue, "", countdown=delay, headers=headers,
            content_type=message.content_type or "application/octet-stream",
            content_encoding=message.content_encoding or "binary", **properties,
        )
        message.ack()
        return count

    def _publish(self, payload: Any, routing_key: str, exchange: str, **kwargs: Any) -> None:
        if self._closed:
            raise RuntimeError("this scheduler is closed")
        if not isinstance(routing_key, str):
            raise TypeError(f"routing_key must be a str, not {type(routing_key).__name__}")
        if not isinstance(exchange, str):
            raise TypeError(f"exchange must be a str, not {type(exchange).__name__}")
        # One publish at a time: a py-amqp channel is not thread-safe, and each publish
        # waits for its confirm (concurrent callers hung, each reading the other's frames).
        with self._lock:
            self._producer.publish(payload, routing_key=routing_key, exchange=exchange, **kwargs)
            self._scheduled += 1

    # -- counters -----------------------------------------------------------

    @property
    def scheduled(self) -> int:
        """Messages handed to this scheduler."""
        return self._scheduled

    @property
    def delivered(self) -> int:
        """Messages its relay delivered to their destination."""
        return self._relay.counters.delivered if self._relay else 0

    @property
    def hops(self) -> int:
        """Times its relay moved a message into a rung; per delivered message, the busy-ness."""
        return self._relay.counters.hops if self._relay else 0

    @property
    def malformed(self) -> int:
        """Messages its relay found without valid schedule headers (parked, not dropped)."""
        return self._relay.counters.malformed if self._relay else 0

    @property
    def parked(self) -> int:
        """Messages its relay parked: malformed, unroutable or refused."""
        return self._relay.counters.parked if self._relay else 0

    @property
    def running(self) -> bool:
        """Whether the scheduler is open (and its relay, if it has one, is consuming)."""
        if self._closed:
            return False
        return self._thread is None or self._thread.is_alive()

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Stop the relay. The queues stay, and so do the messages waiting in them."""
        if self._closed:
            return
        self._closed = True
        if self._relay is not None:
            self._relay.stop()
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self._relay_connection is not None:
            self._relay_connection.release()
        try:
            self._channel.close()
        except Exception:  # noqa: BLE001 - a dead connection has nothing to close
            logger.debug("closing the scheduler channel failed", exc_info=True)

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __str__(self) -> str:
        rungs = ", ".join(describe(r) for r in RUNGS)
        return f"Scheduler{{rungs={rungs}, scheduled={self.scheduled}, delivered={self.delivered}}}"

    def __repr__(self) -> str:
        return f"<{self}>"
