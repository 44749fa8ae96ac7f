"""The Publisher: a relay's publishing channel, and what the broker says of each publish (confirms, returns, closes)."""

from __future__ import annotations

import itertools
import logging
import re
import uuid
from collections import deque
from typing import Any, Callable, Optional

from .. import wire
from ..carry import confirming
from ..contract import DUE_AT, EXCHANGE, PARKED_AT, PARKED_REASON, PARKING, rung_name
from ..envelope import REFUSALS, Decision, Deliver, Hop, Park
from ..link import CONNECTION_ERRORS, HEADER_OVERHEAD, Link, RawMessage, close_quietly
from ..notices import Notices, guarded
from ..observe import lateness_seconds
from ..parking import PARKED_ID
from ..plan import choose_rung
from ..targets import ExchangeCheck
from ..text import escape, quote
from ..topology import parking_queue
from . import outgoing
from .counters import Counters
from .pending import Job, Pending, Publish

__all__ = ["Publisher", "Acker", "RETRY_FIRST", "BACKOFF_FIRST", "BACKOFF_MAX"]

logger = logging.getLogger("kombu_ladder.relay")

W_PARKED = "parked a message: %s"
W_REFUSED = "the broker refused (nack) a delivery to %s/%s; trying again in %.0f s (refusal %d of at most %d)"
W_BACKOFF = "the broker did not take a %s publish (%s); trying again in %.0f s, the message stays unacked"
W_CLOSED = "the broker closed the relay's %s channel: %s"
E_UNMATCHED = "a returned message matches no publish in flight; parking the returned copy: %s"
E_UNATTRIBUTED = ("cannot tell which publish made the broker close the channel (%s); sending the %d publish(es) "
                  "in flight again one at a time (those the broker had taken are delivered twice)")
E_PARKING = "cannot declare the parking queue %s again: %s"

#: Seconds before the first retry of a refused (nacked) delivery; each next one waits twice as long.
RETRY_FIRST = 1.0
#: Seconds before a park or hop the broker did not take is tried again; doubling, up to BACKOFF_MAX.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0

#: RabbitMQ's reply to a publish over ``max_message_size`` (the sizes are the body's).
_OVERSIZE = re.compile(r"message size (\d+) is larger than (?:configured )?max size (\d+)")

#: ``ack(last, singles)``: ack the consumed messages whose publishes are settled (see :meth:`Pending.release`).
Acker = Callable[[Optional[int], list[int]], None]

#: Parking ids: this process's prefix and a counter.
_PARK_PREFIX = uuid.uuid4().hex[:12]
_park_ids = itertools.count(1)


def _names(text: str, exchange: str) -> bool:
    """Whether a broker's reply text is about ``exchange`` (RabbitMQ names the default one amq.default)."""
    return f"exchange '{exchange or 'amq.default'}' in vhost" in text


def _fails_alike(culprit: Publish, text: str) -> Callable[[Publish], bool]:
    """Which publishes the broker would refuse as it refused ``culprit``: to the same exchange, or as big."""
    size = _OVERSIZE.search(text)
    if size is not None:
        limit = int(size.group(2))
        return lambda publish: len(publish.job.body) > limit
    return lambda publish: publish.exchange == culprit.exchange and _names(text, publish.exchange)


class Publisher:
    """A relay's publishing channel on one connection, in confirm mode, and the work in flight on it.

    Every publish is ``mandatory``, and a consumed message is acked (through
    ``ack``) only once the broker confirmed the publish that settles it;
    confirms are pipelined, at most ``max_unconfirmed`` publishes at once (the
    contract's prefetch): the rest wait their turn here, in order. A crash
    redelivers every message the relay had taken and not acked, and those
    already published arrive twice: the cap bounds them, however many held
    messages fall due together.

    * A return (unroutable) is matched to its publish by exchange, routing key,
      body and properties up to the broker's re-encoding (see
      :class:`~kombu_ladder.relay.pending.Pending`), and replaced by a park; a
      returned park means the parking queue is gone: it is declared again and the
      park sent again.
    * A nack of a delivery is retried after a back-off, a bounded number of
      times, then parked; a nacked park or hop is sent again after a back-off.
    * A publish the broker refuses outright (a missing or internal exchange, no
      write permission, a body over ``max_message_size``) closes the channel; the
      consumed messages are on the other channel and stay the relay's. The culprit
      is parked (a park that is the culprit backs off), the publishes the broker
      took before it count as done, those it dropped after it are sent again on a
      new channel, except those it would refuse alike, which are parked with the
      same reason. When nobody can tell the culprit, the publishes that were in
      flight are sent one at a time.
    """

    def __init__(self, link: Link, *, counters: Counters, notices: Notices, clock: Callable[[], float],
                 max_refusals: int, exchange_check: Optional[ExchangeCheck], ack: Acker,
                 max_unconfirmed: int = 0) -> None:
        self.link: Link = link
        self.counters = counters
        self.notices = notices
        self.clock = clock
        #: How many times a delivery the broker refuses through the default exchange is retried.
        self.max_refusals = max_refusals
        #: Learns of the exchanges the broker refused outright (see :meth:`ExchangeCheck.learn`).
        self.exchange_check = exchange_check
        self._ack = ack
        if max_unconfirmed < 0:
            raise ValueError(f"max_unconfirmed must be 0 (no cap) or more, not {max_unconfirmed!r}")
        #: At most this many publishes wait for their confirm at once (0: no cap).
        self.max_unconfirmed = max_unconfirmed
        #: Publishes waiting for the unconfirmed ones to fall under the cap, in the order they were sent.
        self._queued: "deque[Publish]" = deque()
        #: The taken messages and the publishes in flight.
        self.pending = Pending()
        #: The publishing channel (None until :meth:`open`, and while the broker closes it).
        self.channel: Any = None
        #: Publishes waiting for their back-off.
        self._waiting: list[Publish] = []
        #: While suspects are sent one at a time: every publish waiting its turn, suspects first.
        self._careful: Optional["deque[Publish]"] = None
        #: How many of ``_careful``'s first entries are suspects (in flight when the channel closed).
        self._suspects = 0

    def __len__(self) -> int:
        """Publishes not yet confirmed by the broker, those waiting under the cap included."""
        return len(self.pending) + len(self._queued)

    def open(self) -> None:
        """Open the publishing channel, in confirm mode, its closes reported to this publisher."""
        channel = self.link.sibling()
        channel.auto_decode = False  # its returns carry no properties to decode by (see link.Guard)
        confirming(channel, on_ack=self._on_ack, on_nack=self._on_nack, on_return=self._on_return)
        self.link.guard.watch(channel, self._closed)
        self.channel = channel

    def close(self) -> None:
        """Close the publishing channel."""
        self.link.guard.unwatch(self.channel)
        close_quietly(self.channel)
        self.channel = None

    # -- the relay's work ----------------------------------------------------------------

    def track(self, job: Job) -> Job:
        """Record ``job``, just taken from the control queue."""
        return self.pending.track(job)

    def send(self, publish: Publish) -> None:
        """Publish now, or hold it behind a twin in flight, or queue it while sending one at a time."""
        job = publish.job
        if job.tag >= 0 and self.pending.jobs.get(job.tag) is not job:
            return  # the consuming channel was lost: the broker gave the message back to the queue
        if len(publish.raw) > self.link.frame_max - HEADER_OVERHEAD:
            # One frame carries the properties: a bigger one would make the broker close the
            # connection, and the message would come back to do it again.
            self._too_big(publish)
            return
        job.publish = publish
        publish.seq = None
        if self._queued or self._capped() or self.channel is None:
            # behind those already waiting, in the order they were sent; or while the channel is opened
            # again (its open waits for the broker's reply, and the frames read meanwhile are handled)
            self._queued.append(publish)
        else:
            self._dispatch(publish)

    def _capped(self) -> bool:
        """Whether ``max_unconfirmed`` publishes already wait for their confirms."""
        return bool(self.max_unconfirmed) and len(self.pending.sent) >= self.max_unconfirmed

    def _dispatch(self, publish: Publish) -> None:
        if self._careful is not None:
            self._careful.append(publish)
            self._next_careful()
        elif self.pending.submit(publish):
            self._transmit(publish)

    def _drain(self) -> None:
        """Send what waited under the cap, as far as confirms made room (not while sending suspects one at a time)."""
        queued = self._queued
        while queued and self._careful is None and not self._capped() and self.channel is not None:
            publish = queued.popleft()
            job = publish.job
            if job.tag >= 0 and self.pending.jobs.get(job.tag) is not job:
                continue  # the consuming channel was lost meanwhile: the broker took the message back
            if job.publish is publish:
                self._dispatch(publish)

    def admit(self, decision: Decision) -> Decision:
        """Admission, after the decision and before the bytes: a delivery to an exchange the broker would
        refuse outright (missing, or one the relay may not write: a publish to it closes the channel) is
        parked instead, asked of :class:`ExchangeCheck` first (its answers are cached)."""
        check = self.exchange_check
        if not isinstance(decision, Deliver) or not decision.exchange or check is None:
            return decision
        problem = check(decision.exchange)
        if problem is None:
            return decision
        return Park(f"unroutable: target exchange {quote(decision.exchange)} cannot be published "
                    f"to: {problem} (routing_key={quote(decision.routing_key)})")

    def prepare(self, job: Job, decision: Decision, *, raw_only: bool = False) -> Publish:
        """The publish that carries out ``decision`` for ``job``'s message, its properties encoded once
        (:func:`~kombu_ladder.relay.outgoing.encode`; every one is ``mandatory``: a hop into a rung deleted
        under the relay is returned and parked, not lost).

        A park keeps the message's properties as they are, or as raw bytes when no
        client could read them (``raw_only``, or properties it could not read).
        """
        added: tuple[tuple[str, Any], ...] = ()
        if isinstance(decision, Deliver):  # now, or held until due
            kind, exchange, routing_key = "deliver", decision.exchange, decision.routing_key
        elif isinstance(decision, Hop):
            kind, exchange, routing_key = "hop", EXCHANGE, decision.queue
        else:
            kind, exchange, routing_key = "park", "", PARKING
            job.park_reason = decision.reason
            self.notices.warn(decision.reason.split(":", 1)[0], W_PARKED, decision.reason)
            added = ((PARKED_REASON, decision.reason), (PARKED_AT, int(self.clock() * 1000)),
                     (PARKED_ID, f"{_PARK_PREFIX}.{next(_park_ids)}"))
        raw = outgoing.encode(kind, None if raw_only else job.props, job.headers or {}, raw=job.raw, added=added)
        return Publish(job, kind, exchange, routing_key, raw)

    def carry_out(self, job: Job, decision: Decision, *, raw_only: bool = False) -> None:
        """Encode the publish that carries out ``decision`` for ``job``'s message (see :meth:`prepare`) and send it."""
        publish = self.prepare(job, decision, raw_only=raw_only)
        self.send(publish)

    def park(self, job: Job, reason: str, *, raw_only: bool = False) -> None:
        """Park ``job``'s message with ``reason`` (see :meth:`prepare`)."""
        self.carry_out(job, Park(reason), raw_only=raw_only)

    def done(self, job: Job) -> None:
        """Ack ``job``'s message without a publish (a cancelled one is dropped)."""
        job.done = True
        self.settle()

    def forget(self, job: Job) -> None:
        """Give up ``job``: its message goes back to the broker, never to be acked by this relay."""
        self.pending.jobs.pop(job.tag, None)

    def forget_jobs(self) -> None:
        """The consuming channel is gone: the broker took its messages back, so none may be acked."""
        self.pending.forget_jobs()
        self._waiting.clear()
        self._queued = deque(p for p in self._queued if p.job.tag < 0)  # a returned copy's park is the relay's own

    def tick(self) -> None:
        """Send again what waited for its back-off."""
        if not self._waiting:
            return
        now = self.clock()
        due = [p for p in self._waiting if p.due <= now]
        if not due:
            return
        self._waiting = [p for p in self._waiting if p.due > now]
        for publish in due:
            self.send(publish)

    def settle(self) -> None:
        """Ack what finished; send the next suspect when sending one at a time, and what waited under the cap."""
        self._next_careful()
        self._drain()
        last, singles = self.pending.release()
        if last is not None or singles:
            self._ack(last, singles)

    # -- sending -------------------------------------------------------------------------

    def _transmit(self, publish: Publish) -> None:
        self.link.publish_raw(self.channel, RawMessage(publish.job.body, publish.raw), publish.exchange,
                          publish.routing_key)

    def _next_careful(self) -> None:
        """Send the next suspect alone; once none is left, pipeline again what queued up meanwhile."""
        careful = self._careful
        if careful is None or self.pending.sent:
            return
        if self._suspects <= 0 or not careful:
            self._careful = None
            for publish in careful:
                self.send(publish)
            return
        self._suspects -= 1
        publish = careful.popleft()
        if self.pending.submit(publish):
            self._transmit(publish)

    def _too_big(self, publish: Publish) -> None:
        why = (f"its properties would be {len(publish.raw)} bytes, more than one frame of this connection "
               f"holds ({self.link.frame_max - HEADER_OVERHEAD})")
        if publish.kind == "park":
            self._back_off(publish, why)  # not parkable either: it stays unacked, never lost
        else:
            self.park(publish.job, f"malformed: {why}")

    def _back_off(self, publish: Publish, why: str) -> None:
        """Send ``publish`` again later: the message stays unacked meanwhile."""
        job = publish.job
        job.attempts += 1
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (job.attempts - 1))
        self.notices.warn("back-off", W_BACKOFF, publish.kind, why, delay)
        publish.seq = None
        publish.due = self.clock() + delay
        self._waiting.append(publish)

    # -- acks and nacks ------------------------------------------------------------------

    @guarded("a publisher confirm")
    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        for publish in self.pending.confirmed(delivery_tag, multiple):
            self._succeeded(publish)
            self._unhold(publish)
        self.settle()

    @guarded("a publisher nack")
    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        for publish in self.pending.confirmed(delivery_tag, multiple):
            self._unhold(publish)
            if publish.returned is not None:
                continue
            if publish.kind == "deliver":
                self._refused(publish)
            else:
                self._back_off(publish, "nack")
        self.settle()

    def _succeeded(self, publish: Publish) -> None:
        job = publish.job
        if publish.returned is not None or job.publish is not publish:
            return  # its replacement settles the message
        job.done = True
        counters = self.counters
        if publish.kind == "deliver":
            counters.count_delivered(lateness_seconds(job.headers, self.clock()))
        elif publish.kind == "park":
            counters.count_parked(job.park_reason)
        else:
            counters.hops += 1

    def _unhold(self, publish: Publish) -> None:
        for held in self.pending.unhold(publish.key):
            self._transmit(held)

    def _refused(self, publish: Publish) -> None:
        """A refused delivery: back into a rung for a retry, a few times at most, then parked."""
        self.counters.refused += 1
        job = publish.job
        refusals = outgoing.refusals(job.headers) + 1
        # A nack does not say which of an exchange's queues refused: the others may hold a copy
        # already, so a named exchange gets one retry (one copy more at most), the default one more.
        limit = self.max_refusals if publish.exchange == "" else 1
        target = f"{quote(publish.exchange)}/{quote(publish.routing_key)}"
        if refusals > limit:
            self.park(job, f"refused: the broker refused (nack) every delivery to {target}, {refusals} time(s)")
            return
        delay = RETRY_FIRST * 2 ** (refusals - 1)
        self.notices.warn("refused", W_REFUSED, quote(publish.exchange), quote(publish.routing_key), delay,
                          refusals, limit)
        now_ms = int(self.clock() * 1000)
        rung = choose_rung(round(delay * 1000))
        raw = outgoing.encode("retry", job.props, added=((DUE_AT, now_ms + round(delay * 1000)), (REFUSALS, refusals)))
        self.send(Publish(job, "retry", EXCHANGE, rung_name(rung or 1), raw))

    # -- returns -------------------------------------------------------------------------

    @guarded("a returned message")
    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        raw = self.link.guard.take(self.channel) or b"\x00\x00"
        body = bytes(message.body)
        reason = (f"unroutable: {escape(getattr(exc, 'reply_text', exc))} "
                  f"(exchange={quote(exchange)}, routing_key={quote(routing_key)})")
        publish = self.pending.returned(exchange, routing_key, raw, body)
        if publish is None:
            logger.error(E_UNMATCHED, reason)
            orphan = Job(tag=-1, body=body, raw=raw)
            try:
                orphan.props = wire.read_properties(raw)
            except wire.WireError:
                pass
            self.park(orphan, reason)
            return
        publish.returned = reason
        if publish.kind != "park":
            self.park(publish.job, reason)
            return
        # A park came back: the parking queue is gone. Declare it again and park again
        # (the copy waits for the returned publish's confirm, which follows the return).
        publish.job.attempts += 1
        if publish.job.attempts > 1:
            self._back_off(Publish(publish.job, "park", "", PARKING, publish.raw), "the parking queue is missing")
            return
        self._declare_parking()
        self.send(Publish(publish.job, "park", "", PARKING, publish.raw))

    def _declare_parking(self) -> None:
        channel = self.link.sibling()
        try:
            parking_queue()(channel).declare()
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - a park that comes back again is backed off
            logger.error(E_PARKING, PARKING, quote(exc))
        finally:
            close_quietly(channel)

    # -- the broker closes the channel ---------------------------------------------------

    @guarded("the broker closing the publishing channel")
    def _closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        careful = self._careful is not None
        self.link.discard(self.channel)
        self.channel = None
        lost, held = self.pending.lose_channel()
        culprit = self._culprit(lost, text, (class_id, method_id), careful=careful)
        logger.warning(W_CLOSED, "publishing", quote(text))
        self.open()
        if culprit is None:
            logger.error(E_UNATTRIBUTED, quote(text), len(lost))
            self._careful = deque([*lost, *held, *(self._careful or ())])
            self._suspects = len(lost) + len(held)
            self._next_careful()
            return
        index = lost.index(culprit)
        for publish in lost[:index]:  # the broker took these before it closed the channel
            self._succeeded(publish)
        reason = f"unroutable: {escape(text)}"
        self._learn(culprit.exchange, text)
        doomed = _fails_alike(culprit, text)
        for publish in [culprit, *lost[index + 1:], *held]:  # the rest was dropped by the broker
            if publish is not culprit and not doomed(publish):
                self.send(publish)
            elif publish.kind == "park":
                self._back_off(publish, escape(text))
            else:
                self.park(publish.job, reason)
        self._drain()  # what arrived while the channel was opened again (see send)

    def _culprit(self, lost: list[Publish], text: str, method: tuple[int, int], *,
                 careful: bool) -> Optional[Publish]:
        """The publish that made the broker close the channel.

        RabbitMQ handles a channel's publishes in order and drops all after the
        one it refuses, whose exchange (or, over ``max_message_size``, whose
        body size) its reply text names: the first unconfirmed publish that fits
        is the culprit. When sending one at a time, the one in flight is.
        """
        if careful and len(lost) == 1:
            return lost[0]
        if method != (60, 40):  # basic.publish
            return None
        size = _OVERSIZE.search(text)
        for publish in lost:
            if size is not None:
                if len(publish.job.body) == int(size.group(1)):
                    return publish
            elif _names(text, publish.exchange):
                return publish
        return None

    def _learn(self, exchange: str, text: str) -> None:
        check = self.exchange_check
        if check is not None and exchange:
            internal = "internal exchange" in text
            check.learn(exchange, quote(text), ttl=check.ttl if internal else None)
