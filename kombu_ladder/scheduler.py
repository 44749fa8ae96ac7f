"""Scheduler: the AceMQ API (``on``, ``in_``, ``at``, counters) plus delayed republish."""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from datetime import datetime
from types import TracebackType
from typing import Any, Callable, Optional, Union

from .cancellation.stream import cancel_many
from .carry import waiting_for_confirms
from .contract import RUNGS, describe
from .link import clock_of
from .plan import Delay, delay_seconds, to_millis
from .producer import LadderProducer
from .relay import Relay, RelayOptions
from .relay.options import taking_options
from .republishing import original_routing_key, republish_copy, republish_count
from .rescheduling import Rescheduled, reschedule
from .topology import declare_control_plane_if_allowed, declare_or_find

__all__ = ["Scheduler", "original_routing_key", "republish_count"]

logger = logging.getLogger(__name__)

#: How long :meth:`Scheduler.on` waits for its relay to start consuming.
RELAY_START_TIMEOUT = 30.0
#: How many scheduled messages' due times a scheduler remembers, for :meth:`Scheduler.cancel`.
REMEMBER_DUE = 100_000


class Scheduler:
    """Deliver messages later through the ladder.

    Use :meth:`on`: it declares the topology and, unless ``relay=False``, runs a
    relay on its own connection in a background thread. Every publish waits for
    the broker's confirm. The relay's tuning, and the ``max_delay`` and
    ``queue_type`` the scheduler publishes with, are the fields of one
    :class:`~kombu_ladder.relay.RelayOptions`, given as keywords.
    """

    @taking_options
    def __init__(
        self,
        connection: Any,
        *,
        relay: bool = True,
        clock: Optional[Callable[[], float]] = None,
        serializer: Optional[str] = None,
        index: bool = False,
        **values: Any,
    ) -> None:
        self.connection = connection
        #: The relay's tuning, and the ``max_delay`` and ``queue_type`` this scheduler publishes with.
        self.options = RelayOptions.of(**values)
        #: The queue profile: "classic" (the contract) or "quorum" (see :func:`~kombu_ladder.topology.declare`).
        self.queue_type = self.options.queue_type
        #: What due times are stamped with: ``clock``, else the simulator's on a ladder-sim connection.
        self.clock: Callable[[], float] = clock_of(connection, clock)
        #: The longest delay accepted (seconds), for publishing and for the relay.
        self.max_delay = self.options.max_delay
        self._scheduled = 0
        #: message id -> due time (epoch ms) of what this scheduler scheduled lately, newest last.
        self._due: "OrderedDict[str, int]" = OrderedDict()
        self._lock = threading.Lock()
        declare_or_find(connection, queue_type=self.queue_type)
        declare_control_plane_if_allowed(connection)  # the whole topology, where this user may (the quickstarts')
        self._channel = waiting_for_confirms(connection.channel())
        self._producer = LadderProducer(self._channel, serializer=serializer, clock=self.clock,
                                        max_delay=self.max_delay, queue_type=self.queue_type, index=index)
        self._relay: Optional[Relay] = None
        self._thread: Optional[threading.Thread] = None
        self._relay_connection: Any = None
        self._closed = False
        if relay:
            self._start_relay()

    @classmethod
    @taking_options
    def on(cls, connection: Any, *, relay: bool = True, clock: Optional[Callable[[], float]] = None,
           serializer: Optional[str] = None, index: bool = False, **values: Any) -> "Scheduler":
        """Open a scheduler on ``connection`` with its queues declared.

        Arguments:
            connection: a :class:`kombu.Connection`.
            relay: run a relay in a background thread on a connection of its own (default True).
            clock: what due times are stamped with (epoch seconds); the default is the
                wall clock, or the simulator's virtual clock on a ``ladder-sim://`` connection.
            serializer: kombu's serializer for payloads that are not bytes.
            index: append an entry per scheduled message to the ``ladder.index`` stream, so that
                ``kombu-ladder waiting`` finds and lists it (see :doc:`/waiting`); sent in batches, and
                what is left as the scheduler closes.
            prefetch, allowed_exchanges, max_delay, hold_window, hold_capacity, max_refusals, queue_type:
                the relay's tuning, the fields of :class:`~kombu_ladder.relay.RelayOptions` (``max_delay`` is
                also the longest delay accepted, default ten years; ``hold_window`` 0 turns holding off, and
                messages arrive up to a second early; ``queue_type`` is ``"classic"``, the contract, or
                ``"quorum"``: see :func:`~kombu_ladder.declare`).

        Returns:
            The scheduler; use it as a context manager, or call :meth:`close`.

        Raises:
            TypeError, ValueError: an option is unknown or out of range (the message names it).
        """
        return cls(connection, relay=relay, clock=clock, serializer=serializer, index=index, **values)

    def _start_relay(self) -> None:
        self._relay_connection = self.connection.clone()
        self._relay = Relay(self._relay_connection, clock=self.clock, options=self.options)
        self._thread = threading.Thread(target=self._relay.run, name="kombu-ladder-relay", daemon=True)
        self._thread.start()
        if not self._relay.ready.wait(RELAY_START_TIMEOUT):
            self.close()
            raise TimeoutError(f"the relay did not start consuming within {RELAY_START_TIMEOUT:g}s")

    # -- scheduling ---------------------------------------------------------

    def in_(self, delay: Delay, payload: Any, *, routing_key: str, exchange: str = "", **kwargs: Any) -> str:
        """Deliver ``payload`` after ``delay`` (seconds, or a timedelta); return its message id.

        Zero or negative delivers immediately. ``**kwargs`` go to
        :meth:`kombu.Producer.publish` (``headers``, ``serializer``, AMQP properties); any other
        keyword raises :class:`TypeError`, as a misspelt argument does in Python.
        The id is the AMQP ``message_id`` given in ``**kwargs``, or a new UUID;
        pass it to :meth:`cancel`.

        Raises:
            TypeError: ``delay`` is not a number or timedelta, ``routing_key`` not a str, or a keyword is
                neither :meth:`kombu.Producer.publish`'s nor an AMQP property.
            ValueError: ``delay`` is NaN, infinite or over ``max_delay`` (:data:`~kombu_ladder.plan.MAX_DELAY`),
                or ``routing_key`` is empty for the default exchange.
        """
        # Checked here: None would otherwise mean "no delay" to the producer.
        seconds = delay_seconds(delay, argument="delay", max_delay=self.max_delay)
        due = int((self.clock() + max(seconds, 0.0)) * 1000)
        return self._publish(payload, routing_key, exchange, countdown=delay, due_ms=due, **kwargs)

    def at(self, when: datetime, payload: Any, *, routing_key: str, exchange: str = "", **kwargs: Any) -> str:
        """Deliver ``payload`` at ``when``, an aware datetime; the past delivers now. Return its message id.

        Raises:
            TypeError: ``when`` is not a datetime.
            ValueError: ``when`` is naive, or see :meth:`in_`.
        """
        due = to_millis(when, argument="when")  # None would otherwise mean "no delay" to the producer
        return self._publish(payload, routing_key, exchange, eta=when, due_ms=due, **kwargs)

    def cancel(self, message_id: str, *, due: Optional[datetime] = None) -> None:
        """Cancel the waiting message ``message_id`` (a message id or a Celery task id); return once the
        broker confirmed the record.

        Every relay, including one started later, drops the message with that id
        waiting now when it next reaches it (at a hop or at delivery) and counts it
        under ``cancelled``. A message already delivered is not taken back, and one
        scheduled later with the same id is delivered. ``due`` (an aware datetime)
        bounds how long relays keep the cancellation; for a message this scheduler
        scheduled lately it is known already.

        Raises:
            TypeError, ValueError: ``message_id`` cannot be an AMQP message id.
        """
        if self._closed:
            raise RuntimeError("this scheduler is closed")
        with self._lock:
            known = self._due.get(message_id) if isinstance(message_id, str) else None
            cancel_many(self.connection, [message_id], due=due if due is not None else known, clock=self.clock)

    def reschedule(self, message_id: str, when: Union[Delay, datetime]) -> Rescheduled:
        """Make the waiting message ``message_id`` (a message id or a Celery task id) due at ``when``: an aware
        datetime, or a delay from now (seconds or a timedelta).

        It is taken from where it waits and put back, due at the new time, in one
        transaction: it reaches its target once. A scan of the rungs finds it (see
        :func:`~kombu_ladder.rescheduling.reschedule`); the result's ``found`` is None when
        no waiting message has the id (delivered already, or held by a relay for its last
        seconds).

        Raises:
            TypeError, ValueError: ``when`` names no time.
        """
        if self._closed:
            raise RuntimeError("this scheduler is closed")
        with self._lock:
            return reschedule(self.connection, message_id, when, clock=self.clock)

    def run_now(self, message_id: str) -> Rescheduled:
        """Deliver the waiting message ``message_id`` now (see :meth:`reschedule`)."""
        return self.reschedule(message_id, 0)

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
        body, options, count = republish_copy(message)
        self._publish(body, queue, "", countdown=delay, **options)
        message.ack()
        return count

    def _publish(self, payload: Any, routing_key: str, exchange: str, *, due_ms: Optional[int] = None,
                 **kwargs: Any) -> str:
        if self._closed:
            raise RuntimeError("this scheduler is closed")
        if not isinstance(routing_key, str):
            raise TypeError(f"routing_key must be a str, not {type(routing_key).__name__}")
        if not isinstance(exchange, str):
            raise TypeError(f"exchange must be a str, not {type(exchange).__name__}")
        # One publish at a time: a py-amqp channel is not thread-safe, and each publish
        # waits for its confirm (concurrent callers hung, each reading the other's frames).
        message_id = kwargs.get("message_id")
        if message_id is None and due_ms is not None:  # in_ and at; a republish keeps what it had
            message_id = kwargs["message_id"] = str(uuid.uuid4())
        with self._lock:
            self._producer.publish(payload, routing_key=routing_key, exchange=exchange, **kwargs)
            self._scheduled += 1
            if due_ms is not None and isinstance(message_id, str):
                self._due[message_id] = due_ms
                if len(self._due) > REMEMBER_DUE:
                    self._due.popitem(last=False)
        return "" if message_id is None else str(message_id)

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
    def cancelled(self) -> int:
        """Cancelled messages its relay dropped (at a hop or at delivery)."""
        return self._relay.counters.cancelled if self._relay else 0

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
