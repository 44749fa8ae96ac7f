"""Move the messages waiting in one broker's ladder to another's (blue-green migration)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from kombu import Connection, Consumer, Queue

from .cancellation.records import CELERY_TASK_HEADER, STREAM, LiveSet, cancelled_id, read_from
from .cancellation.stream import cancel_many
from .carry import bytes_of, confirming, prepare_copy
from .contract import CONTROL, EXCHANGE, PARKING, rung_names
from .controlplane import READ_TIMEOUT
from .controlplane.codec import Cancel
from .controlplane.reader import NotReadToEnd, StreamMissing, read_to_end
from .envelope import strip_death
from .errors import LadderError
from .index.records import STREAM as INDEX
from .index.records import Entry, entry_of
from .index.writer import append as append_index
from .link import clock_of
from .topology import declare

__all__ = ["MoveResult", "move"]

logger = logging.getLogger(__name__)

I_MOVED = "moved %d message(s) from %s"
I_DROPPED = "dropped %d cancelled message(s) from %s instead of moving them"
I_RECANCELLED = "recorded on the target %d cancellation(s) written on the source during the move"
W_NO_RECORDS = ("the source's %s was not read to its end within %.0f s; messages cancelled by the records "
                "not read are moved")
W_UNINDEXED = "the rest of the move is not indexed on the target's %s (%d entr(y/ies) so far)"

index_logger = logging.getLogger("kombu_ladder.index")

#: Messages moved per round: consumed with this prefetch, published, confirmed together, then acked.
BATCH = 200

#: Seconds without a delivery after which a queue counts as drained.
IDLE = 2.0

@dataclass(frozen=True)
class MoveResult:
    """What :func:`move` did: messages moved per source queue."""

    moved: dict[str, int] = field(default_factory=dict)
    #: Messages dropped per source queue instead of moved: the source's cancellations cancel them.
    cancelled: dict[str, int] = field(default_factory=dict)
    #: Entries for the moved messages appended to the target's ``ladder.index`` (see :func:`move`).
    indexed: int = 0
    #: Moved messages cancelled on the source while the move ran, whose cancellation was recorded on the target.
    recancelled: int = 0

    @property
    def total(self) -> int:
        """Messages moved from every queue together."""
        return sum(self.moved.values())


def move(source: Connection, target: Connection, *, limit: Optional[int] = None,
         include_parked: bool = True, queue_type: str = "classic") -> MoveResult:
    """Move every message waiting in ``source``'s ladder into ``target``'s.

    Each rung and the control queue are emptied into ``target``'s
    ``acemq.schedule`` exchange with the routing key ``acemq.schedule.due``:
    ``target``'s relay then reads each message's ``x-schedule-due-at`` and puts
    it into the right rung, or delivers it when it is due, so no due time
    changes. Parked messages go to ``target``'s parking queue, unchanged.

    The source's cancellations (``ladder.cancellations``, the records a relay
    would read) are read first: a rung or control-queue message one of them
    cancels is acked on ``source`` and not moved, as a relay would have dropped
    it (counted in :attr:`MoveResult.cancelled`). A message in a rung carries
    no rung-entry time, so there its id alone decides; parked messages are
    always moved. Once the queues are moved the source's cancellations are read
    again: one written during the move for a message that was moved is recorded
    on ``target`` too, where its relays drop the message (counted in
    :attr:`MoveResult.recancelled`).

    The index of waiting work moves too: where the source or the target has a
    ``ladder.index`` stream (declared on the target when only the source has
    one), an entry for each message moved from a rung or the control queue
    (its ids, task name, target, due time and size; published now) is
    appended to the target's, after each batch was confirmed by the target and
    before it is acked on the source, so that
    ``waiting find`` on the target finds it (counted in
    :attr:`MoveResult.indexed`). An entry the target refuses is logged on the
    ``kombu_ladder.index`` logger and the move goes on, unindexed from there.

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
        queue_type: the profile declared on ``target``: ``"classic"`` (the contract) or ``"quorum"``
            (see :func:`~kombu_ladder.topology.declare`); moving between profiles is allowed.

    Returns:
        A :class:`MoveResult`.

    Raises:
        ValueError: ``limit`` is not a positive integer, or ``queue_type`` is unknown.
        TopologyConflict: ``target``'s ladder is declared with another profile.
        LadderError: ``target`` refused or did not confirm a batch; it stays on ``source``.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, not {limit!r}")
    declare(target, queue_type=queue_type)
    queues = [*rung_names(), CONTROL] + ([PARKING] if include_parked else [])
    clock = clock_of(source, None)
    live = read_cancellations(source, clock=clock)
    source_indexed = _has_index(source)
    carry = _IndexCarry(target, clock, declare=source_indexed,
                        enabled=source_indexed or _has_index(target))
    moved: dict[str, int] = {}
    cancelled: dict[str, int] = {}
    moved_ids: set[tuple[Any, Any]] = set()
    out = target.channel()
    confirms = _Confirms(target, out)
    try:
        for name in queues:
            drop = None if name == PARKING or not len(live) else _Dropper(live, clock)
            moved[name] = _move_queue(source, confirms, name, limit, drop,
                                      None if name == PARKING else carry,
                                      None if name == PARKING else moved_ids)
            cancelled[name] = drop.count if drop is not None else 0
            if moved[name]:
                logger.info(I_MOVED, moved[name], name)
            if cancelled[name]:
                logger.info(I_DROPPED, cancelled[name], name)
    finally:
        out.close()
    return MoveResult(moved, cancelled, carry.written, _recancel(source, target, moved_ids, clock))


def _ids(message: Any) -> tuple[Any, Any]:
    """A moved message's AMQP ``message_id``, and its task id when it is a Celery task message."""
    properties, headers = message.properties or {}, message.headers or {}
    return properties.get("message_id"), properties.get("correlation_id") if CELERY_TASK_HEADER in headers else None


def _recancel(source: Connection, target: Connection, moved_ids: set[tuple[Any, Any]],
              clock: Callable[[], float]) -> int:
    """Record on ``target`` the cancellations written on ``source`` for messages it moved (read once more, now
    that the move is done): one written while the move ran would otherwise apply to nothing."""
    if not moved_ids:
        return 0
    live = read_cancellations(source, clock=clock)
    now = int(clock() * 1000)
    ids = sorted({text for pair in moved_ids for text in pair
                  if isinstance(text, str) and text and live.cancelled(text, now)})
    if ids:
        cancel_many(target, ids, clock=clock)
        logger.info(I_RECANCELLED, len(ids))
    return len(ids)


def _has_index(connection: Connection) -> bool:
    """Whether ``connection``'s vhost has the ``ladder.index`` stream (the index of waiting work is in use)."""
    try:
        channel = connection.channel()
    except Exception:  # noqa: BLE001 - the move itself reports a connection that does not work
        return False
    try:
        channel.queue_declare(INDEX, passive=True)
        return True
    except connection.channel_errors:
        return False
    finally:
        try:
            channel.close()
        except Exception:  # noqa: BLE001 - a passive declare that failed closed it already
            logger.debug("closing the index probe channel failed", exc_info=True)


class _IndexCarry:
    """The index entries of the moved messages, appended to the target's ``ladder.index`` per confirmed batch."""

    def __init__(self, target: Connection, clock: Callable[[], float], *, declare: bool, enabled: bool) -> None:
        self.target, self.clock, self.declare, self.enabled = target, clock, declare, enabled
        self.pending: list[Entry] = []
        self.written = 0

    def add(self, message: Any) -> None:
        """Keep the entry of ``message`` (moved from a rung or the control queue), if it is a ladder message."""
        if not self.enabled:
            return
        try:
            found = entry_of(message.properties or {}, message.headers or {}, len(bytes_of(message.body)),
                             at=int(self.clock() * 1000))
        except Exception:  # noqa: BLE001 - an untrusted message: it is moved all the same, only unindexed
            index_logger.debug("no index entry for a moved message", exc_info=True)
            return
        if found is not None:
            self.pending.append(found)

    def flush(self) -> None:
        """Append the entries kept (their messages are confirmed by the target); a refusal stops the carrying."""
        pending, self.pending = self.pending, []
        if not pending or not self.enabled:
            return
        if append_index(self.target, pending, declare=self.declare,
                        what="those moved messages are waiting on the target, unindexed"):
            self.written += len(pending)
            self.declare = False
            return
        self.enabled = False
        index_logger.warning(W_UNINDEXED, INDEX, self.written)


class _Dropper:
    """Says whether a source message is cancelled (and counts those that are)."""

    def __init__(self, live: LiveSet, clock: Callable[[], float]) -> None:
        self.live, self.clock, self.count = live, clock, 0

    def __call__(self, message: Any) -> bool:
        properties = message.properties or {}
        found = cancelled_id(self.live, int(self.clock() * 1000), properties.get("message_id"),
                             properties.get("correlation_id"), message.headers or {})
        self.count += found is not None
        return found is not None


def read_cancellations(source: Connection, *, clock: Callable[[], float] = time.time) -> LiveSet:
    """The live cancellations of ``source``'s ``ladder.cancellations``, read as a relay reads them.

    The records of the last :data:`~kombu_ladder.cancellation.records.READ_BACK_MS` are read up to a
    marker appended to the stream (:func:`~kombu_ladder.controlplane.reader.read_to_end`); none when the
    stream does not exist. Bad records are skipped and counted.
    """
    live = LiveSet()
    now = int(clock() * 1000)

    def on_record(record: object, offset: Optional[int]) -> None:
        if isinstance(record, Cancel):
            for each in record.each():
                live.add(each, now)

    try:
        read_to_end(source, STREAM, on_record=on_record, start=lambda: read_from(clock()), clock=clock)
    except StreamMissing:
        pass  # no stream: nothing was ever cancelled there
    except NotReadToEnd:
        logger.warning(W_NO_RECORDS, STREAM, READ_TIMEOUT)
    return live


def _move_queue(source: Connection, confirms: "_Confirms", name: str, limit: Optional[int],
                drop: Optional[_Dropper] = None, carry: Optional[_IndexCarry] = None,
                moved_ids: Optional[set[tuple[Any, Any]]] = None) -> int:
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
            copied = []
            for message in batch:
                if drop is not None and drop(message):
                    continue  # cancelled: acked with its batch, never moved
                confirms.publish(message, parked=name == PARKING)
                copied.append(message)
                if carry is not None:
                    carry.add(message)
            confirms.wait()
            if carry is not None:
                carry.flush()  # indexed on the target before the source lets go of the batch
            batch[-1].ack(multiple=True)
            if moved_ids is not None:
                moved_ids.update(_ids(message) for message in copied)
            count += len(batch)
        return count - (drop.count if drop is not None else 0)
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

