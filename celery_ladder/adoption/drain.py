"""``celery ladder adopt``: move the ETA tasks already waiting in a task queue into the ladder."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from kombu_ladder.plan import to_millis

from ..settings import LadderSettings
from .records import ADOPT, ADOPTED_HEADER, CHECK, threshold, verdict
from .transfer import Mover, Records, task_due

__all__ = ["DrainReport", "drain", "BATCH"]

logger = logging.getLogger(__name__)

#: Copies committed per transaction (their originals' acks with them).
BATCH = 200


@dataclass
class DrainReport:
    """What :func:`drain` did to one queue (with ``dry_run``, what it would have done)."""

    queue: str
    dry_run: bool
    #: Messages taken from the queue and looked at (at most its depth when the drain began).
    looked_at: int = 0
    #: ETA tasks moved into the ladder: copy committed, original acked in the same transaction.
    adopted: int = 0
    #: Redelivered originals of tasks adopted already (their worker died before acking them): acked.
    originals_dropped: int = 0
    #: Left in place: messages without an ETA (or not Celery task messages, or an unreadable ETA).
    no_eta: int = 0
    #: Left in place: ETA tasks due within the hold window, or due already.
    due_soon: int = 0
    #: Left in place: copies the ladder delivered already (they carry the adoption header).
    copies: int = 0

    @property
    def left(self) -> int:
        """Messages left in place, in their order."""
        return self.no_eta + self.due_soon + self.copies

    def as_dict(self) -> dict[str, Any]:
        """The report as a plain dict (``left`` included)."""
        return {**asdict(self), "left": self.left}


def drain(connection: Any, queue: str, *, settings: LadderSettings, timezone: Any = None, dry_run: bool = False,
          limit: Optional[int] = None, clock: Optional[Callable[[], float]] = None) -> DrainReport:
    """Move the ETA tasks waiting in ``queue`` into the ladder; leave every other message where it is.

    The messages present when the drain begins (at most ``limit``) are taken one by one.
    An ETA task due further ahead than the hold window is copied into the ladder (the
    same message, delivered to the exchange and routing key it came through, with
    :data:`~.records.ADOPTED_HEADER`) and acked in the same transaction, committed every
    :data:`BATCH` tasks: a crash leaves each task either in the queue or in the ladder.
    Every other message is held unacked until the end and then given back, each to its
    place (RabbitMQ requeues to the original position), so the ones without an ETA keep
    their order. Workers consuming ``queue`` meanwhile do not see the held messages.

    Arguments:
        connection: a :class:`kombu.Connection` to the broker (connected or not).
        queue: the task queue's name; it must exist.
        settings: the app's settings (hold window, max delay, queue type).
        timezone: the app's timezone, for an ETA sent naive (``app.conf.timezone``).
        dry_run: take and give back every message, count what would be adopted, change nothing.
        limit: look at most at this many messages.
        clock: epoch seconds (default: the wall clock, or the simulator's on ``ladder-sim://``).

    Raises:
        LookupError: ``queue`` does not exist.
        ValueError: ``limit`` is not a positive integer.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, not {limit!r}")
    from kombu_ladder.link import clock_of

    clock = clock_of(connection, clock)
    depth = _depth(connection, queue)
    report = DrainReport(queue, dry_run)
    mover = None if dry_run else Mover(connection, settings=settings, clock=clock)
    channel = mover.channel if mover is not None else connection.channel()
    records: Optional[Records] = None
    ahead_ms = int(threshold(settings.hold_window) * 1000)
    try:
        while report.looked_at < (depth if limit is None else min(depth, limit)):
            raw = channel.basic_get(queue, no_ack=False)
            if raw is None:
                break
            message = channel.message_to_python(raw)
            report.looked_at += 1
            headers = message.headers if isinstance(message.headers, dict) else {}
            eta = task_due(headers, timezone)
            if eta is None or "id" not in headers:
                report.no_eta += 1
                continue
            if headers.get(ADOPTED_HEADER) == headers.get("eta"):
                report.copies += 1
                continue
            now_ms = int(clock() * 1000)
            redelivered = bool((message.delivery_info or {}).get("redelivered"))
            decided = verdict(headers, redelivered=redelivered, due_ms=to_millis(eta), now_ms=now_ms,
                              ahead_ms=ahead_ms)
            if decided == CHECK:
                if records is None:
                    records = Records(connection, clock=clock)
                    records.catch_up()
                if (str(headers["id"]), str(headers["eta"])) in records.adopted:
                    report.originals_dropped += 1
                    if mover is not None:
                        message.ack()
                    continue
                decided = verdict(headers, redelivered=False, due_ms=to_millis(eta), now_ms=now_ms,
                                  ahead_ms=ahead_ms)
            if decided != ADOPT:
                report.due_soon += 1
                continue
            if mover is not None:
                try:
                    mover.stage(message, eta)
                except (ValueError, TypeError) as exc:
                    logger.warning("task %s: left in place, it cannot be adopted (%s)", headers.get("id"), exc)
                    report.due_soon += 1
                    continue
                message.ack()
                if mover.staged >= BATCH:
                    mover.commit()
            report.adopted += 1
        if mover is not None:
            mover.commit()
    finally:
        if records is not None:
            records.close()
        try:
            channel.close()  # what is held unacked goes back, each to its place; what is not committed, away
        except Exception:  # noqa: BLE001 - a dead connection gives everything back by itself
            logger.debug("closing the drain channel failed", exc_info=True)
    return report


def _depth(connection: Any, queue: str) -> int:
    """The number of ready messages in ``queue``, on a channel of its own (a missing queue closes it)."""
    channel = connection.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except connection.channel_errors as exc:
        if getattr(exc, "reply_code", None) == 404 or "NOT_FOUND" in str(exc):
            raise LookupError(f"queue {queue!r} does not exist") from None
        raise
    finally:
        try:
            channel.close()
        except Exception:  # noqa: BLE001 - the broker closed it already
            pass
