"""RelayCore: a message arrives, its fate is decided once, and it is published, held or parked."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from types import TracebackType
from typing import Any, Callable, NamedTuple, Optional

from .. import readable, wire
from ..contract import CONTROL, PARKING
from ..envelope import Decision, Hold, Hop, Park, decide
from ..link import CONNECTION_ERRORS, Link, Schedule, link_for
from ..notices import Notices, guarded
from ..plan import fit_rung
from ..targets import ExchangeCheck
from ..text import escape, quote
from . import outgoing
from .cancelwatch import CancelWatch
from .counters import AllowList, Counters
from .holder import GUESS_BYTES, Holder
from .options import RelayOptions
from .pending import Job
from .publisher import Publisher

__all__ = ["RelayCore"]

logger = logging.getLogger("kombu_ladder.relay")

E_MESSAGE = "the relay failed on a message (delivery tag %s); parking it"
I_CONSUMING = "ladder relay consuming from %s (prefetch %d, publisher confirms)"
I_CANCELLED = "dropped cancelled message %s (its id is in ladder.cancellations)"
W_CLOSED = "the broker closed the relay's %s channel: %s"
I_PAUSED = ("the relay holds %d bytes, its hold_bytes budget (%d): it takes no new messages until held ones are "
            "delivered")
I_STANDING_DOWN = ("stopping: %d held message(s) put back into the ladder's rungs, %d delivered (due); the quorum "
                   "control queue would count a requeue against their delivery limit")
I_RESUMED = "the relay holds %d bytes again, within its hold_bytes budget (%d): it takes new messages again"
D_WINDOW = "the relay consumes with a window of %d (%d held, %d bytes; largest message lately %d bytes)"

#: How many of the latest messages' sizes the relay's window is reckoned from.
SIZES_KEPT = 64
#: How many cancelled consumer tags keep their callback (for deliveries already on their way).
RETIRED_KEPT = 16


class Held(NamedTuple):
    """A message the relay holds until it is due, and the decision to deliver it then (encoded only then)."""

    job: Job
    decision: Hold


class RelayCore:
    """The relay's logic on one connection, independent of how it is driven.

    :meth:`consumer` takes the channel to consume ``acemq.schedule.due`` on and
    returns the core as what a consumer loop holds (kombu's ``ConsumerMixin``:
    :meth:`consume`, :meth:`cancel`, a context manager). :meth:`on_message` is
    the one place a message's fate is decided (:func:`~kombu_ladder.envelope.decide`);
    one ``except`` (:meth:`_safely`) around that, and around carrying out a held
    decision when it falls due, parks the message with the reason. The core owns the
    objects that carry the decision out: a :class:`~kombu_ladder.relay.publisher.Publisher`
    (a second channel of the same connection, in confirm mode: a publish the broker
    refuses with a channel error never takes the consumed messages back) and a
    :class:`~kombu_ladder.relay.holder.Holder` (deliveries held to their due
    time). The cancellations are read by a
    :class:`~kombu_ladder.relay.cancelwatch.CancelWatch`, which the core asks
    about each message. A driver calls :meth:`tick` about once a second, for
    back-offs and log summaries, and :meth:`fire` when a held message is due.
    """

    def __init__(self, *, options: Optional[RelayOptions] = None, clock: Optional[Callable[[], float]] = None,
                 counters: Optional[Counters] = None, exchange_check: Optional[ExchangeCheck] = None) -> None:
        self.options = options if options is not None else RelayOptions()
        self._clock_given = clock
        #: The relay's clock (epoch seconds): the one given, else its connection's (see Link.clock).
        self.clock: Callable[[], float] = clock if clock is not None else time.time
        self.allow = AllowList(self.options.allowed_exchanges)
        self.counters = counters if counters is not None else Counters()
        #: Parks deliveries to a missing exchange before a publish there closes the channel (None: no check).
        self.exchange_check = exchange_check
        self.notices = Notices(logger)
        #: The deliveries held to their due time.
        self.held = Holder(window_ms=self.options.hold_window_ms, capacity=self.options.hold_capacity,
                           budget=self.options.hold_bytes)
        #: What the relay publishes on its current connection (None before :meth:`consumer`).
        self.publisher: Optional[Publisher] = None
        #: The live cancellations, read from ``ladder.cancellations``.
        self.cancels = CancelWatch(clock=self.clock, notices=self.notices)
        #: Set once the relay consumes the control queue (after reading the cancellations).
        self.consuming = threading.Event()
        self._link: Optional[Link] = None
        self._consume: Any = None
        self._tag: Optional[str] = None
        #: Whether the relay takes no new messages (its held bytes fill the budget).
        self._paused = False
        #: Consumer tags cancelled without waiting: deliveries already on their way still reach the relay.
        self._retired: "deque[str]" = deque()
        #: The consumer's prefetch window now (the contract's prefetch plus room for held messages).
        self._window = 0
        #: The sizes of the latest messages taken (body and properties), for the window.
        self._sizes: "deque[int]" = deque(maxlen=SIZES_KEPT)
        self._schedule: Optional[Schedule] = None

    @property
    def channel(self) -> Any:
        """The channel the relay consumes on (None while it has none)."""
        return self._consume

    @property
    def outstanding(self) -> int:
        """Publishes not yet confirmed by the broker."""
        return len(self.publisher) if self.publisher is not None else 0

    # -- what a consumer loop holds -----------------------------------------------------

    def consumer(self, channel: Any) -> "RelayCore":
        """Take ``channel`` to consume on (a new connection after a reconnect); call :meth:`consume` to start."""
        link = self._link = link_for(channel)
        if self._clock_given is None:
            self.clock = self.cancels.clock = link.clock
        self._consume = channel
        self.held.release()  # the old channel's held messages went back to the broker
        self.publisher = Publisher(link, counters=self.counters, notices=self.notices, clock=self.clock,
                                   max_refusals=self.options.max_refusals, exchange_check=self.exchange_check,
                                   ack=self._ack, max_unconfirmed=self.options.prefetch)
        return self

    def consume(self) -> None:
        """Open the publishing channel; consume ``acemq.schedule.due`` once the cancellations are read."""
        link, channel, publisher = self._link, self._consume, self.publisher
        if link is None or publisher is None:
            raise RuntimeError("RelayCore.consume() needs a channel: call consumer(channel) first")
        publisher.open()
        timers = link.timers()
        if timers is not None:  # a transport keeping time of its own (the simulator's virtual clock)
            self.wake_with(timers)
        self.cancels.start(link.sibling(), link.guard, lambda: self._open_consumer(channel))

    def cancel(self) -> None:
        """Stop taking messages; what was taken is still published and acked as confirms arrive."""
        channel, tag = self._consume, self._tag
        self._tag, self._paused = None, False
        self.cancels.stop_waiting()  # a relay stopping before it caught up never starts consuming
        if channel is not None and tag is not None:
            try:
                channel.basic_cancel(tag)
            except CONNECTION_ERRORS:
                logger.debug("cancelling the relay consumer failed", exc_info=True)

    def __enter__(self) -> "RelayCore":
        self.consume()
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.cancel()

    def __repr__(self) -> str:
        return f"<RelayCore consuming {CONTROL} (parks to {PARKING})>"

    def _open_consumer(self, channel: Any) -> None:
        if channel is not self._consume or self._link is None:
            return  # a stale start: the relay reconnected since
        channel.auto_decode = False  # the relay passes bodies on as bytes
        self._link.guard.watch(channel, self._consume_closed)
        self.held.release()  # a new consuming channel: what was held went back to the broker
        self._paused = False
        self._retired.clear()
        prefetch = self._window = self._wanted()  # held messages never stall the hops
        channel.basic_qos(0, prefetch, False)
        self._tag = channel.basic_consume(CONTROL, callback=self.on_message, no_ack=False)
        logger.info(I_CONSUMING, CONTROL, prefetch)
        self.consuming.set()

    @guarded("the broker closing the consuming channel")
    def _consume_closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        """The broker took back every message the relay held: forget them and consume again."""
        logger.warning(W_CLOSED, "consuming", quote(text))
        link, publisher = self._link, self.publisher
        if link is None or publisher is None:
            return
        link.discard(self._consume)
        self._consume = None
        publisher.forget_jobs()
        channel = self._consume = link.sibling()
        self._open_consumer(channel)

    def _ack(self, last: Optional[int], singles: list[int]) -> None:
        """Ack consumed messages whose publishes the broker confirmed (see Pending.release)."""
        channel = self._consume
        if channel is None:
            return
        if last is not None:
            channel.basic_ack(last, multiple=True)
        for tag in singles:
            channel.basic_ack(tag)

    def stand_down(self) -> None:
        """A clean stop begins (the consumer is cancelled): give up the held messages, before the wait for confirms.

        On the contract's classic control queue they are requeued at once, for another relay to hold
        and deliver on time. On a quorum control queue a requeue counts against the message's delivery
        limit (RabbitMQ 4.0 sets 20; a policy may set 3), so a rolling restart would dead-letter messages
        that never failed: each is published back into the rung that fits what remains of its delay
        (the 1 s rung under a second: late by less than a second, never early), or delivered when it is
        due, and acked once the broker confirms that publish, like any hop.
        """
        publisher = self.publisher
        if self.options.queue_type != "quorum" or publisher is None or publisher.channel is None:
            self._release_held()
            return
        now_ms, hops, delivered = int(self.clock() * 1000), 0, 0
        for due_ms, held in self.held.release_with_due():
            if due_ms <= now_ms:
                self._carry_out(held.job, held.decision)
                delivered += 1
            else:
                self._carry_out(held.job, Hop(fit_rung(due_ms - now_ms) or 1))
                hops += 1
        if hops or delivered:
            logger.info(I_STANDING_DOWN, hops, delivered)

    def close(self) -> None:
        """Give held messages back; close the publishing channel (the consuming one is the driver's)."""
        self._release_held()
        if self._link is not None:
            self._link.guard.unwatch(self._consume)
        if self.publisher is not None:
            self.publisher.close()
        self.cancels.close()

    def _release_held(self) -> None:
        """Give every held message back to the broker (requeued at once, for any relay to take)."""
        channel = self._consume
        for held in self.held.release():
            job = held.job
            if self.publisher is not None:
                self.publisher.forget(job)
            if channel is None:
                continue
            try:
                channel.basic_reject(job.tag, requeue=True)
            except CONNECTION_ERRORS:
                logger.debug("requeueing a held message failed; the broker requeues it with the channel")
                channel = None

    # -- time ------------------------------------------------------------------------------

    @guarded("a tick")
    def tick(self) -> None:
        """Send again what waited for its back-off; write the log summaries that are due."""
        if self.publisher is not None:
            self.publisher.tick()
        if len(self.held):
            self.fire()  # a backstop; drivers call fire() at the due time
        self.cancels.tick()
        self.notices.flush()

    def wake_with(self, schedule: Optional[Schedule]) -> None:
        """Have a driver's timer run :meth:`fire` when held messages fall due, or stop that (None).

        ``schedule(seconds, callback)`` sets one entry in the driver's loop. The
        relay keeps at most one pending (:class:`~kombu_ladder.relay.holder.Alarm`):
        in a Celery worker they share the hub's timer with the tasks' ETAs.
        """
        self.held.wake_with(schedule, self.fire, self.clock)

    @property
    def wakeup(self) -> Optional[Callable[[float], None]]:
        """The timer the held messages wake the relay with (None: the driver asks :meth:`next_wakeup`)."""
        return self.held.wakeup

    def next_wakeup(self) -> Optional[float]:
        """Seconds until the earliest held message is due (0 when it is), or None when none is held."""
        return self.held.next_wakeup(self.clock())

    @guarded("held deliveries")
    def fire(self) -> None:
        """Publish every held delivery that is due (the driver calls this at the due time)."""
        for held in self.held.take_due(self.clock()):
            if not self._cancelled_while_held(held.job):
                self._carry_out(held.job, held.decision)
        self._pace()

    # -- back-pressure: the byte budget -----------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether the relay takes no new messages because its held bytes fill ``hold_bytes``."""
        return self._paused

    def _largest(self) -> int:
        """The largest of the latest messages (before any: :data:`~kombu_ladder.relay.holder.GUESS_BYTES`)."""
        return max(self._sizes) if self._sizes else GUESS_BYTES

    def _wanted(self) -> int:
        """The consumer window the held messages and the latest sizes call for (see :meth:`Holder.room`)."""
        return self.options.prefetch + self.held.room(self._largest())

    def _pace(self) -> None:
        """Keep the bytes the relay takes within ``hold_bytes``: its consumer window, and a stop while full.

        * While the held bytes fill the budget the relay takes no new messages; it takes them again once
          half of it is free. They stay ready in the control queue meanwhile (for this relay later, or
          another now): none is taken back, requeued or delivered early.
        * Its window is the contract's prefetch plus room for held messages, reckoned in bytes from the
          latest sizes (:meth:`Holder.room`); when that changes twofold or more the relay consumes again
          with the new window (RabbitMQ applies ``basic.qos`` to new consumers only).

        Every method is sent without waiting for the broker's reply, whose wait would read (and handle)
        deliveries here, inside the handling of one. Each new consumer has a new tag; a cancelled one's
        deliveries already on their way still arrive, and take a rung when they cannot be held.
        """
        channel, held = self._consume, self.held
        if channel is None or self._link is None:
            return
        if self._tag is not None and held.full:
            self._retire(channel)
            self._paused = True
            logger.info(I_PAUSED, held.bytes, held.budget)
        elif self._paused:
            if held.roomy:
                self._consume_again(channel)
                logger.info(I_RESUMED, held.bytes, held.budget)
        elif self._tag is not None:
            wanted = self._wanted()
            if wanted >= 2 * self._window or 4 * wanted <= self._window:
                self._retire(channel)
                self._consume_again(channel)

    def _retire(self, channel: Any) -> None:
        """Cancel the consumer without waiting; its callback stays for the deliveries already on their way."""
        tag, self._tag = self._tag, None
        if tag is None or self._link is None:
            return
        channel.basic_cancel(tag, nowait=True)
        self._retired.append(tag)
        while len(self._retired) > RETIRED_KEPT:
            self._link.forget_consumer(channel, self._retired.popleft())

    def _consume_again(self, channel: Any) -> None:
        """Consume with the window wanted now, under a new consumer tag (a quorum queue refuses to take an
        old one back while it has messages out: RabbitMQ 3.10 closed the connection, INTERNAL_ERROR)."""
        assert self._link is not None  # checked by _pace
        self._paused = False
        self._window = window = self._wanted()
        self._link.set_prefetch(channel, window)
        self._tag = channel.basic_consume(CONTROL, consumer_tag=f"ladder-relay-{uuid.uuid4().hex}",
                                          callback=self.on_message, no_ack=False, nowait=True)
        logger.debug(D_WINDOW, window, len(self.held), self.held.bytes, self._largest())

    # -- one expired message -------------------------------------------------------------

    def on_message(self, message: Any) -> None:
        """Handle one expired message from the control queue: the one place its fate is decided."""
        self.counters.received += 1
        publisher, link = self.publisher, self._link
        if publisher is None or link is None:
            return  # never: the consumer is registered by consume(), after consumer()
        raw = link.guard.take(self._consume)
        tag = message.delivery_info["delivery_tag"]
        job = publisher.track(Job(tag=tag, body=bytes(message.body), raw=b"\x00\x00" if raw is None else raw))
        self._sizes.append(_size(job))
        self._safely(job, self._handle)
        self._pace()

    def _safely(self, job: Job, step: Callable[[Job], None]) -> None:
        """Run ``step`` on ``job``: the one boundary, so that no message stops the relay. A message that
        makes it fail before its publish was sent is parked with the error, its properties as bytes."""
        try:
            step(job)
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - the one boundary: no message stops the relay
            self.notices.warn("internal", E_MESSAGE, job.tag, level=logging.ERROR, exc_info=True)
            if job.publish is None and self.publisher is not None:
                self.publisher.park(job, f"unhandled: the relay failed on this message: {type(exc).__name__}: "
                                         f"{escape(exc)}", raw_only=True)

    def _handle(self, job: Job) -> None:
        """Read the message once and decide once; then hold the decision, or carry it out (deliver, hop, park)."""
        decision = self._decide(job)
        if decision is None:
            return  # cancelled: dropped
        if isinstance(decision, Hold):
            self.held.hold(decision.due_at, Held(job, decision), self.clock(), size=_size(job))
        else:
            self.publisher.carry_out(job, decision)  # type: ignore[union-attr]  # a message arrives only with one

    def _carry_out(self, job: Job, decision: Decision) -> None:
        """Carry out ``decision`` for a message that was held (within the boundary of :meth:`_safely`)."""
        self._safely(job, lambda job: self.publisher.carry_out(job, decision))  # type: ignore[union-attr]

    def _decide(self, job: Job) -> Optional[Decision]:
        """Where ``job``'s message goes (any problem is a Park with the reason); None: it is cancelled, and dropped."""
        try:
            props = wire.read_properties(job.raw)
        except wire.WireError as exc:
            return Park(f"malformed: its properties cannot be read: {escape(exc)}")
        problem = readable.problem(props)
        if problem is not None:
            return Park(f"malformed: {problem}; its properties are kept as bytes")
        job.props = props
        job.headers = None if props.headers is None else outgoing.Headers(props.headers)  # the other fields stay bytes
        cancelled = self.cancels.cancelled(props.fields.get("message_id"), props.fields.get("correlation_id"),
                                           job.headers)
        if cancelled is not None:
            self._drop_cancelled(job, cancelled)
            return None
        repeated = outgoing.twice(props, job.headers)
        if repeated is not None:
            return Park(f"malformed: header {repeated} is given more than once")
        size = _size(job)
        decision = decide(job.headers, int(self.clock() * 1000), allow_exchange=self.allow,
                          max_delay_ms=self.options.max_delay_ms, hold_window_ms=self.held.window_ms,
                          can_hold=self.held.fits(size))
        self.held.step(decision)
        return self.publisher.admit(decision)  # type: ignore[union-attr]  # a message arrives only with one

    def _cancelled_while_held(self, job: Job) -> bool:
        """Drop a held delivery whose cancellation arrived while it was held (checked again at its due time)."""
        fields = job.props.fields if job.props is not None else {}
        cancelled = self.cancels.cancelled(fields.get("message_id"), fields.get("correlation_id"), job.headers)
        if cancelled is not None:
            self._drop_cancelled(job, cancelled)
        return cancelled is not None

    def _drop_cancelled(self, job: Job, message_id: str) -> None:
        """Ack and drop a cancelled message: no publish, counted and logged with its id."""
        self.counters.cancelled += 1
        logger.info(I_CANCELLED, quote(message_id))
        self.publisher.done(job)  # type: ignore[union-attr]  # a message arrives only while it has one


def _size(job: Job) -> int:
    """The bytes a held message keeps in memory: its body and its properties."""
    return len(job.body) + len(job.raw)
