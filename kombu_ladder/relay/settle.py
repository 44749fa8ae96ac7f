"""What the broker says about the relay's publishes (acks, nacks, returns) and what the relay does then."""

from __future__ import annotations

import functools
import itertools
import logging
import uuid
from collections import deque
from typing import Any, Callable, Optional, TypeVar

from amqp.exceptions import ConnectionError as AMQPConnectionError

from .. import wire
from ..contract import EXCHANGE, PARKING, rung_name
from ..observe import lateness_seconds
from ..plan import choose_rung
from ..text import escape, quote
from . import link, outgoing
from .counters import Counters
from .notices import Notices
from .pending import Job, Pending, Publish

__all__ = ["Settlement", "CONNECTION_ERRORS", "guarded"]

logger = logging.getLogger("kombu_ladder.relay")

W_PARKED = "parked a message: %s"
W_REFUSED = "the broker refused (nack) a delivery to %s/%s; trying again in %.0f s (refusal %d of at most %d)"
W_BACKOFF = "the broker did not take a %s publish (%s); trying again in %.0f s, the message stays unacked"
E_UNMATCHED = "a returned message matches no publish in flight; parking the returned copy: %s"
E_HANDLER = "the relay failed while handling %s (it keeps running; the message(s) concerned stay unacked)"

#: What a dead connection raises: these go to the consumer loop, which reconnects.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (AMQPConnectionError, OSError)

#: Seconds before the first retry of a refused (nacked) delivery; each next one waits twice as long.
RETRY_FIRST = 1.0
#: Retries of a delivery refused through the default exchange (one queue: a retry duplicates nothing).
MAX_REFUSALS = 5
#: Seconds before a park or hop the broker did not take is tried again; doubling, up to BACKOFF_MAX.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
#: The most characters of a parking reason (it quotes what the message held).
MAX_REASON = 1000

F = TypeVar("F", bound=Callable[..., Any])


def guarded(what: str) -> Callable[[F], F]:
    """Keep any exception but a lost connection from leaving a broker callback (it is logged)."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except CONNECTION_ERRORS:
                raise
            except Exception:  # noqa: BLE001 - the boundary: a relay never dies of one message
                self.notices.warn("internal", E_HANDLER, what, level=logging.ERROR, exc_info=True)
                return None
        return wrapper  # type: ignore[return-value]

    return decorate


class Settlement:
    """The publishing half of :class:`~kombu_ladder.relay.RelayCore` (mixed into it, which owns the state).

    * An ack settles a publish: its message is acked once that is confirmed.
    * A return (unroutable) is matched to its publish by the exact bytes it
      carries, and replaced by a park; a returned park means the parking queue
      is gone: it is declared again and the park sent again.
    * A nack of a delivery is retried after a back-off, a bounded number of
      times, then parked; a nacked park or hop is sent again after a back-off.
      The message is never acked before its publish is confirmed.
    * After a channel close nobody can attribute, the publishes that were in
      flight are sent one at a time (see :mod:`~kombu_ladder.relay.closes`).
    """

    clock: Callable[[], float]
    counters: Counters
    notices: Notices
    pending: Pending
    exchange_check: Optional[Callable[[str], Optional[str]]]
    max_refusals: int
    _publisher: Any
    _consume: Any
    _guard: Any
    _waiting: list[Publish]
    #: While suspects are sent one at a time: every publish waiting its turn, suspects first.
    _careful: Optional["deque[Publish]"]
    #: How many of ``_careful``'s first entries are suspects (in flight when the channel closed).
    _suspects: int = 0

    _park_ids = itertools.count(1)
    _park_prefix = uuid.uuid4().hex[:12]

    # -- sending ---------------------------------------------------------------------

    def _send(self, publish: Publish) -> None:
        """Publish now, or hold it behind a twin in flight, or queue it while sending one at a time."""
        job = publish.job
        if job.tag >= 0 and self.pending.jobs.get(job.tag) is not job:
            return  # the consuming channel was lost: the broker gave the message back to the queue
        if len(publish.raw) > link.max_properties(self._publisher):
            # One frame carries the properties: a bigger one would make the broker close the
            # connection, and the message would come back to do it again.
            self._too_big(publish)
            return
        job.publish = publish
        publish.seq = None
        if self._careful is not None:
            self._careful.append(publish)
            self._next_careful()
        elif self.pending.submit(publish):
            self._transmit(publish)

    def _transmit(self, publish: Publish) -> None:
        link.publish(self._publisher, link.RawMessage(publish.job.body, publish.raw), publish.exchange,
                     publish.routing_key)

    def _next_careful(self) -> None:
        """Send the next suspect alone; once none is left, pipeline again what queued up meanwhile."""
        careful = self._careful
        if careful is None or self.pending.sent:
            return
        if self._suspects <= 0 or not careful:
            self._careful = None
            for publish in careful:
                self._send(publish)
            return
        self._suspects -= 1
        publish = careful.popleft()
        if self.pending.submit(publish):
            self._transmit(publish)

    def _park(self, job: Job, reason: str, *, raw_only: bool = False) -> None:
        """Park ``job``'s message with ``reason``: its properties as they are, or as raw bytes when no
        client could read them."""
        reason = escape(reason, limit=MAX_REASON)
        job.park_reason = reason
        at = int(self.clock() * 1000)
        park_id = f"{self._park_prefix}.{next(self._park_ids)}"
        raw = None
        if not raw_only and job.props is not None:
            try:
                raw = outgoing.park(job.props, reason=reason, at=at, park_id=park_id)
            except wire.WireError:
                raw = None
        if raw is None:
            raw = outgoing.quarantine(job.raw, reason=reason, at=at, park_id=park_id)
        self.notices.warn(reason.split(":", 1)[0], W_PARKED, reason)
        self._send(Publish(job, "park", "", PARKING, raw))

    # -- acks and nacks ------------------------------------------------------------------

    @guarded("a publisher confirm")
    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        for publish in self.pending.confirmed(delivery_tag, multiple):
            self._succeeded(publish)
            self._unhold(publish)
        self._settled()

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
        self._settled()

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
        held = self.pending.unhold(publish.key)
        if held is not None and self.pending.submit(held):
            self._transmit(held)

    def _settled(self) -> None:
        self._next_careful()
        last, singles = self.pending.release()
        channel = self._consume
        if channel is None:
            return
        if last is not None:
            channel.basic_ack(last, multiple=True)
        for tag in singles:
            channel.basic_ack(tag)

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
            self._park(job, f"refused: the broker refused (nack) every delivery to {target}, {refusals} time(s)")
            return
        delay = RETRY_FIRST * 2 ** (refusals - 1)
        self.notices.warn("refused", W_REFUSED, quote(publish.exchange), quote(publish.routing_key), delay,
                          refusals, limit)
        now_ms = int(self.clock() * 1000)
        rung = choose_rung(round(delay * 1000))
        raw = outgoing.retry(job.props, due_at=now_ms + round(delay * 1000), refusals=refusals)
        self._send(Publish(job, "retry", EXCHANGE, rung_name(rung or 1), raw))

    def _too_big(self, publish: Publish) -> None:
        why = (f"its properties would be {len(publish.raw)} bytes, more than one frame of this connection "
               f"holds ({link.max_properties(self._publisher)})")
        if publish.kind == "park":
            self._back_off(publish, why)  # not parkable either: it stays unacked, never lost
        else:
            self._park(publish.job, f"malformed: {why}")

    def _back_off(self, publish: Publish, why: str) -> None:
        """Send ``publish`` again later: the message stays unacked meanwhile."""
        job = publish.job
        job.attempts += 1
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (job.attempts - 1))
        self.notices.warn("back-off", W_BACKOFF, publish.kind, why, delay)
        publish.seq = None
        publish.due = self.clock() + delay
        self._waiting.append(publish)

    # -- returns ----------------------------------------------------------------------

    @guarded("a returned message")
    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        raw = self._guard.take(self._publisher) or b"\x00\x00"
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
            self._park(orphan, reason)
            return
        publish.returned = reason
        if publish.kind != "park":
            self._park(publish.job, reason)
            return
        # A park came back: the parking queue is gone. Declare it again and park again
        # (the copy waits for the returned publish's confirm, which follows the return).
        publish.job.attempts += 1
        if publish.job.attempts > 1:
            self._back_off(Publish(publish.job, "park", "", PARKING, publish.raw), "the parking queue is missing")
            return
        self._declare_parking()
        self._send(Publish(publish.job, "park", "", PARKING, publish.raw))

    def _declare_parking(self) -> None:
        from ..topology import parking_queue

        channel = link.sibling(self._publisher)
        try:
            parking_queue()(channel).declare()
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - a park that comes back again is backed off
            logger.error("cannot declare the parking queue %s again: %s", PARKING, quote(exc))
        finally:
            link.close_quietly(channel)

    # -- time -------------------------------------------------------------------------

    def _due_again(self, now: float) -> None:
        due = [p for p in self._waiting if p.due <= now]
        if not due:
            return
        self._waiting = [p for p in self._waiting if p.due > now]
        for publish in due:
            self._send(publish)
