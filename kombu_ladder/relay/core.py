"""RelayCore: one expired message becomes exactly one delivery, hop or parking, acked after confirm."""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Any, Callable, Iterable, Optional

from .. import readable, wire
from ..carry import confirming
from ..contract import CONTROL, EXCHANGE, PARKING, PREFETCH
from ..envelope import Deliver, Hop, Park, decide
from ..plan import MAX_DELAY, check_max_delay
from ..text import escape, quote
from ..timing import HOLD_CAPACITY, HOLD_WINDOW
from . import link, outgoing
from .cancelwatch import CancelWatch
from .closes import ChannelCloses
from .counters import AllowList, Counters
from .notices import Notices
from .pending import Job, Pending, Publish
from .residual import Residuals
from .settle import CONNECTION_ERRORS, MAX_REFUSALS, guarded

__all__ = ["RelayCore", "RelayConsumer"]

logger = logging.getLogger("kombu_ladder.relay")

E_MESSAGE = "the relay failed on a message (delivery tag %s); parking it"
I_CONSUMING = "ladder relay consuming from %s (prefetch %d, publisher confirms)"
I_CANCELLED = "dropped cancelled message %s (its id is in ladder.cancellations)"


class RelayCore(ChannelCloses, Residuals):
    """The relay's logic on one connection, independent of how it is driven.

    :meth:`consumer` takes the channel to consume ``acemq.schedule.due`` on and
    returns what a consumer loop holds (kombu's ``ConsumerMixin``, a Celery
    ``ConsumerStep``); publishes go on a second channel of the same connection,
    in confirm mode, so a publish the broker refuses with a channel error
    never takes the consumed messages back. Each expired message is published
    exactly once (a delivery, a hop or a parking, every one ``mandatory``) and
    acked only after the broker confirmed that publish; confirms are
    pipelined across the prefetch window. Whatever a message holds, its
    handling ends in a publish: :meth:`on_message` is the one place its fate
    is decided, and the one ``except`` around it parks it with the reason.
    The standalone :class:`~kombu_ladder.relay.Relay`, the Celery bootstep and
    the simulator all drive this class; the driver calls :meth:`tick` about
    once a second, for back-offs and log summaries, and :meth:`fire` when a
    held message is due (see :class:`~kombu_ladder.relay.residual.Residuals`).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        counters: Optional[Counters] = None,
        exchange_check: Optional[Callable[[str], Optional[str]]] = None,
        max_refusals: int = MAX_REFUSALS,
        max_delay: float = MAX_DELAY,
        hold_window: float = HOLD_WINDOW,
        hold_capacity: int = HOLD_CAPACITY,
        cancellations: bool = True,
    ) -> None:
        #: A due time further ahead than this (ms) is parked as malformed: a unit mistake.
        self.max_delay_ms = round(check_max_delay(max_delay) * 1000)
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1:
            raise ValueError(f"prefetch must be a positive integer, not {prefetch!r}")
        if not isinstance(max_refusals, int) or isinstance(max_refusals, bool) or max_refusals < 0:
            raise ValueError(f"max_refusals must be a non-negative integer, not {max_refusals!r}")
        self.clock = clock
        self.prefetch = prefetch
        self.allow = AllowList(allowed_exchanges)
        self.counters = counters if counters is not None else Counters()
        #: Returns why a target exchange cannot be published to (None if it can); see ExchangeCheck.
        self.exchange_check = exchange_check
        #: How many times a delivery the broker refuses through the default exchange is retried.
        self.max_refusals = max_refusals
        self.notices = Notices(logger)
        self.pending = Pending()
        self._consume: Any = None
        self._publisher: Any = None
        self._guard: Any = None
        self._tag: Optional[str] = None
        self._waiting: list[Publish] = []
        self._careful = None
        self._init_holding(hold_window, hold_capacity)  # issue 14: hold the residual
        #: The live cancellations, read from ``ladder.cancellations`` (None: not enforced).
        self.cancels = CancelWatch(clock=clock, horizon_ms=self.max_delay_ms) if cancellations else None
        #: Set once the relay consumes the control queue (after reading the cancellations).
        self.consuming = threading.Event()

    @property
    def channel(self) -> Any:
        """The channel the relay consumes on (None while it has none)."""
        return self._consume

    def consumer(self, channel: Any) -> "RelayConsumer":
        """Take ``channel`` to consume on; return the consumer (call ``consume()`` to start)."""
        self._consume = channel
        self._publisher = None  # a new connection (after a reconnect): the old channels are gone
        self.pending = Pending()
        self._waiting = []
        self._careful = None
        self.held.clear()  # issue 14: the old channel's held messages went back to the broker
        return RelayConsumer(self)

    @property
    def outstanding(self) -> int:
        """Publishes not yet confirmed by the broker."""
        return len(self.pending)

    # -- channels ----------------------------------------------------------------------

    def _start(self) -> None:
        self._guard = link.guard_of(self._consume)
        self._open_publisher()
        if self.cancels is None:
            self._open_consumer(self._consume)
        else:  # the control queue only once every earlier cancellation is known
            channel = self._consume
            self.cancels.start(link.sibling(channel), self._guard, lambda: self._open_consumer(channel))
        # issue 14: a driver that keeps virtual time (the simulator) wakes the relay for held messages
        timers = getattr(getattr(self._consume, "connection", None), "ladder_timers", None)
        if timers is not None:
            self.wake_with(lambda seconds, fire: timers(fire)(seconds))

    def _open_publisher(self) -> None:
        channel = link.sibling(self._consume)
        channel.auto_decode = False  # its returns carry no properties to decode by (see link.Guard)
        confirming(channel, on_ack=self._on_ack, on_nack=self._on_nack, on_return=self._on_return)
        self._guard.watch(channel, self._publisher_closed)
        self._publisher = channel

    def _open_consumer(self, channel: Any) -> None:
        if channel is not self._consume:
            return  # a stale start: the relay reconnected since
        self._consume = channel
        channel.auto_decode = False  # the relay passes bodies on as bytes
        self._guard.watch(channel, self._consume_closed)
        self.held.clear()  # issue 14: a new consuming channel: what was held went back to the broker
        # issue 14: room for held messages on top of the prefetch, so that they never stall the hops
        channel.basic_qos(0, self.prefetch + self.held.capacity, False)
        self._tag = channel.basic_consume(CONTROL, callback=self.on_message, no_ack=False)
        logger.info(I_CONSUMING, CONTROL, self.prefetch + self.held.capacity)
        self.consuming.set()

    def _cancel(self) -> None:
        """Stop taking messages; what was taken is still published and acked as confirms arrive."""
        channel, tag = self._consume, self._tag
        self._tag = None
        if self.cancels is not None:
            self.cancels.stop_waiting()  # a relay stopping before it caught up never starts consuming
        if channel is not None and tag is not None:
            try:
                channel.basic_cancel(tag)
            except CONNECTION_ERRORS:
                logger.debug("cancelling the relay consumer failed", exc_info=True)

    def close(self) -> None:
        """Give held messages back; close the publishing channel (the consuming one is the driver's)."""
        self._release_held()  # issue 14
        if self._guard is not None:
            self._guard.unwatch(self._publisher)
            self._guard.unwatch(self._consume)
        link.close_quietly(self._publisher)
        self._publisher = None
        if self.cancels is not None:
            self.cancels.close()

    @guarded("a tick")
    def tick(self) -> None:
        """Send again what waited for its back-off; write the log summaries that are due."""
        if self._waiting:
            self._due_again(self.clock())
        if len(self.held):
            self.fire()  # issue 14: a backstop; drivers call fire() at the due time
        if self.cancels is not None:
            self.cancels.tick()
        self.notices.flush()

    # -- one expired message -------------------------------------------------------------

    def on_message(self, message: Any) -> None:
        """Handle one expired message from the control queue: the one place its fate is decided."""
        self.counters.received += 1
        raw = self._guard.take(self._consume) if self._guard is not None else None
        tag = message.delivery_info["delivery_tag"]
        job = self.pending.track(Job(tag=tag, body=bytes(message.body), raw=b"\x00\x00" if raw is None else raw))
        self._hold_due = None  # issue 14: set by the plan for this message alone
        try:
            self._handle(job)
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - the one boundary: no message stops the relay
            self.notices.warn("internal", E_MESSAGE, tag, level=logging.ERROR, exc_info=True)
            if job.publish is None:
                self._park(job, f"unhandled: the relay failed on this message: {type(exc).__name__}: "
                                f"{escape(exc)}", raw_only=True)

    def _handle(self, job: Job) -> None:
        try:
            props = wire.read_properties(job.raw)
        except wire.WireError as exc:
            return self._park(job, f"malformed: its properties cannot be read: {escape(exc)}", raw_only=True)
        problem = readable.problem(props)
        if problem is not None:
            return self._park(job, f"malformed: {problem}; its properties are kept as bytes", raw_only=True)
        job.props = props
        cancelled = None if self.cancels is None else self.cancels.cancelled(
            props.fields.get("message_id"), props.fields.get("correlation_id"))
        if cancelled is not None:
            return self._drop_cancelled(job, cancelled)
        job.headers, properties = outgoing.views(props)
        repeated = outgoing.twice(props, job.headers)
        if repeated is not None:
            return self._park(job, f"malformed: header {repeated} is given more than once")
        decision = decide(job.headers, properties, int(self.clock() * 1000), allow_exchange=self.allow,
                          max_delay_ms=self.max_delay_ms, plan=self._plan)
        if isinstance(decision, Deliver) and decision.exchange and self.exchange_check is not None:
            # A publish the broker refuses outright (a missing exchange, one the relay may not
            # write) closes the channel: better asked first (the answer is cached).
            problem = self.exchange_check(decision.exchange)
            if problem is not None:
                decision = Park(f"unroutable: target exchange {quote(decision.exchange)} cannot be published "
                                f"to: {problem} (routing_key={quote(decision.routing_key)})")
        if isinstance(decision, Deliver):
            raw = outgoing.delivery(props, job.headers or {})
            # issue 14: held until due when the plan said so
            self._deliver_or_hold(Publish(job, "deliver", decision.exchange, decision.routing_key, raw))
        elif isinstance(decision, Hop):
            # Mandatory too: a hop into a rung deleted under the relay is returned and parked, not lost.
            self._send(Publish(job, "hop", EXCHANGE, decision.queue, outgoing.hop(props)))
        else:
            self._park(job, decision.reason)
        return None

    def _cancelled_while_held(self, publish: Publish) -> bool:
        """Drop a held delivery whose cancellation arrived while it was held (checked again at its due time)."""
        fields = publish.job.props.fields if publish.job.props is not None else {}
        cancelled = None if self.cancels is None else self.cancels.cancelled(
            fields.get("message_id"), fields.get("correlation_id"))
        if cancelled is not None:
            self._drop_cancelled(publish.job, cancelled)
        return cancelled is not None

    def _drop_cancelled(self, job: Job, message_id: str) -> None:
        """Ack and drop a cancelled message: no publish, counted and logged with its id."""
        job.done = True
        self.counters.cancelled += 1
        logger.info(I_CANCELLED, quote(message_id))
        self._settled()


class RelayConsumer:
    """What a consumer loop holds for the relay: ``consume``, ``cancel``, its ``channel``; a context manager."""

    def __init__(self, core: RelayCore) -> None:
        self.core = core

    @property
    def channel(self) -> Any:
        """The channel the relay consumes on."""
        return self.core.channel

    def consume(self) -> None:
        """Open the publishing channel and start consuming ``acemq.schedule.due``."""
        self.core._start()

    def cancel(self) -> None:
        """Stop consuming (confirms of what was taken still arrive and are acted on)."""
        self.core._cancel()

    def __enter__(self) -> "RelayConsumer":
        self.consume()
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.cancel()

    def __repr__(self) -> str:
        return f"<RelayConsumer of {CONTROL} (parks to {PARKING})>"
