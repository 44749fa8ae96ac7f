"""Move the messages waiting in one broker's ladder to another's (blue-green migration)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from kombu import Connection, Consumer, Queue

from .carry import confirming, prepare_copy
from .contract import CONTROL, EXCHANGE, PARKING, rung_names
from .envelope import strip_death
from .errors import LadderError
from .topology import declare

__all__ = ["MoveResult", "move"]

logger = logging.getLogger(__name__)

I_MOVED = "moved %d message(s) from %s"

#: Messages moved per round: consumed with this prefetch, published, confirmed together, then acked.
BATCH = 200

#: Seconds without a delivery after which a queue counts as drained.
IDLE = 2.0

@dataclass(frozen=True)
class MoveResult:
    """What :func:`move` did: messages moved per source queue."""

    moved: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Messages moved from every queue together."""
        return sum(self.moved.values())


def move(source: Connection, target: Connection, *, limit: Optional[int] = None,
         include_parked: bool = True) -> MoveResult:
    """Move every message waiting in ``source``'s ladder into ``target``'s.

    Each rung and the control queue are emptied into ``target``'s
    ``acemq.schedule`` exchange with the routing key ``acemq.schedule.due``:
    ``target``'s relay then reads each message's ``x-schedule-due-at`` and puts
    it into the right rung, or delivers it when it is due, so no due time
    changes. Parked messages go to ``target``'s parking queue, unchanged.

    Body, properties and application headers are copied unchanged (minus
    RabbitMQ's ``x-death`` bookkeeping). Each message is acked on ``source``
    only after ``target`` confirmed it (in batches of ``BATCH`` = 200, confirms
    pipelined): a crash can duplicate a message, never lose one. Each queue
    is moved up to the depth it had when its turn came, so a source that
    still has producers or a relay does not keep the move going.

    Arguments:
        source: the broker to empty (the "blue" one).
        target: the broker to fill (the "green" one); its topology is declared.
        limit: move at most this many messages per queue.
        include_parked: also move ``acemq.schedule.parked``.

    Returns:
        A :class:`MoveResult`.

    Raises:
        ValueError: ``limit`` is not a positive integer.
        LadderError: ``target`` refused or did not confirm a batch; it stays on ``source``.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, not {limit!r}")
    declare(target)
    queues = [*rung_names(), CONTROL] + ([PARKING] if include_parked else [])
    moved: dict[str, int] = {}
    out = target.channel()
    confirms = _Confirms(target, out)
    try:
        for name in queues:
            moved[name] = _move_queue(source, confirms, name, limit)
            if moved[name]:
                logger.info(I_MOVED, moved[name], name)
    finally:
        out.close()
    return MoveResult(moved)


def _move_queue(source: Connection, confirms: "_Confirms", name: str, limit: Optional[int]) -> int:
    channel = source.channel()
    try:
        try:
            _, depth, _ = channel.queue_declare(name, passive=True)
        except source.channel_errors:
            return 0  # no such queue on the source: nothing waits there
        budget = depth if limit is None else min(depth, limit)
        if budget == 0:
            return 0
        received: list[Any] = []
        consumer = Consumer(channel, queues=[Queue(name, no_declare=True)], on_message=received.append,
                            prefetch_count=min(BATCH, budget), no_ack=False, accept=None)
        consumer.consume()
        count = 0
        while count < budget:
            want = min(BATCH, budget - count)
            while len(received) < want:
                try:
                    source.drain_events(timeout=IDLE)
                except TimeoutError:
                    break  # the queue ran dry before its starting depth was reached
            if not received:
                break
            batch, received[:] = received[:want], received[want:]
            for message in batch:
                confirms.publish(message, parked=name == PARKING)
            confirms.wait()
            batch[-1].ack(multiple=True)
            count += len(batch)
        return count
    finally:
        try:
            channel.close()  # unacked extras (prefetched past the budget) go back to the queue
        except Exception:  # noqa: BLE001 - the broker may have closed it already
            logger.debug("closing the source channel failed", exc_info=True)


class _Confirms:
    """Publishes on the target channel in confirm mode, and waits for a batch's confirms."""

    def __init__(self, connection: Connection, channel: Any) -> None:
        self.connection = connection
        self.channel = channel
        self.published = 0
        self.confirmed = 0
        self.refused: list[str] = []
        confirming(channel, on_ack=self._on_ack, on_nack=self._on_nack, on_return=self._on_return)

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self.confirmed = max(self.confirmed, delivery_tag)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self.refused.append(f"nacked (delivery tag {delivery_tag})")
        self.confirmed = max(self.confirmed, delivery_tag)

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        self.refused.append(f"returned by {exchange!r}/{routing_key!r}: {getattr(exc, 'reply_text', exc)}")

    def publish(self, message: Any, *, parked: bool) -> None:
        prepared = prepare_copy(self.channel, message.body, message.properties or {},
                                strip_death(message.headers or {}))
        exchange, routing_key = ("", PARKING) if parked else (EXCHANGE, CONTROL)
        # The class's publish, not a confirm_publish replacement that would wait on each message.
        type(self.channel).basic_publish(self.channel, prepared, exchange=exchange, routing_key=routing_key,
                                         mandatory=True)
        self.published += 1

    def wait(self, timeout: float = 60.0) -> None:
        """Wait until the target confirmed everything published so far.

        Raises:
            LadderError: the target refused (nacked or returned) a message, or did not
                confirm in ``timeout`` seconds; the batch stays unacked on the source.
        """
        deadline = time.monotonic() + timeout
        while self.confirmed < self.published:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LadderError(f"the target did not confirm {self.published - self.confirmed} message(s) "
                                  f"within {timeout:g}s; they stay on the source")
            try:
                self.connection.drain_events(timeout=min(remaining, 1.0))
            except TimeoutError:
                continue
        if self.refused:
            raise LadderError(f"the target refused messages ({'; '.join(self.refused[:3])}); "
                              "that batch stays on the source")

