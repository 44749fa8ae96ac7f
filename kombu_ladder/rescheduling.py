"""Move a waiting message in time, or run it now: taken from where it waits and put back due at its new time.

The message is found as :func:`~kombu_ladder.peek.find` finds it (the rungs longest
first, then ``acemq.schedule.due``), on a channel of its own. There, in one AMQP
transaction, a copy due at the new time is published into ``acemq.schedule.due`` and
the original is acked: the broker applies both or neither, so the message reaches its
target once, never as the original and the copy, never as neither (a process that dies
before the commit leaves the original where it was). A relay takes the copy at once and
holds it, hops it into the rung that fits, or delivers it when it is due now. Every
other message the scan looked at goes back to its place.

The copy is the same message (body, properties, headers, routing, message id) with a
new ``x-schedule-due-at``; a Celery task message (protocol 2) also gets the new time as
its ``eta`` header, which the worker waits for.

Where the index of waiting work is in use (the ``ladder.index`` stream exists), an entry
for the copy, due at the new time and naming the due time it replaces, is appended after
the commit: the next sync shows the new due time in place of the old one. A failure to
append is logged and changes nothing of the move.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional, Union

from .carry import bytes_of, prepare_copy
from .contract import CONTROL, DUE_AT, rung_names
from .index.records import Entry, entry_of
from .index.writer import append as append_index
from .peek import DEFAULT_LIMIT, Progress, Sighting, find
from .plan import Delay, delay_seconds, parse_due_at, to_millis

__all__ = ["RESCHEDULED_QUEUES", "Rescheduled", "reschedule", "due_from", "moved_headers"]

logger = logging.getLogger("kombu_ladder.rescheduling")

#: Where :func:`reschedule` looks for the message, in this order. Not the parking queue: a parked
#: message goes back with ``replay``.
RESCHEDULED_QUEUES: tuple[str, ...] = (*rung_names(), CONTROL)

I_MOVED = "moved %s from %s (due %s) to due %s"


@dataclass(frozen=True)
class Rescheduled:
    """What :func:`reschedule` did."""

    #: Where the message waited, and its old due time (None: no waiting message has the id).
    found: Optional[Sighting]
    #: Its new due time, epoch milliseconds.
    due_at: int
    #: Messages looked at, in all queues.
    looked_at: int
    #: Seconds the scan and the move took.
    seconds: float
    #: Whether the scan stopped at ``limit`` before looking at every message.
    truncated: bool
    #: Whether an entry for the copy, due at its new time, was appended to ``ladder.index`` (False: nothing
    #: was moved, the stream does not exist, or the broker refused it; see :doc:`/waiting`).
    indexed: bool = False


def due_from(when: Union[Delay, datetime], now: float, *, argument: str = "when") -> int:
    """The due time (epoch ms) ``when`` names: an aware datetime, or seconds (a number or timedelta) from ``now``;
    the past is now.

    Raises:
        TypeError, ValueError: ``when`` names no time, or one further than
            :data:`~kombu_ladder.plan.MAX_DELAY` ahead (naming ``argument``).
    """
    if isinstance(when, datetime):
        due_at = to_millis(when, argument=argument)
        delay_seconds(due_at / 1000 - now, argument=argument)  # within max_delay, as a delay would be
        return max(due_at, int(now * 1000))
    seconds = delay_seconds(when, argument=argument)
    return int((now + max(seconds, 0.0)) * 1000)


def moved_headers(headers: Mapping[str, Any], due_at: int) -> dict[str, Any]:
    """``headers`` with the due time ``due_at`` (epoch ms): ``x-schedule-due-at``, and a Celery task's ``eta``."""
    out = dict(headers)
    out[DUE_AT] = int(due_at)
    if out.get("eta") is not None and "task" in out and "id" in out:  # Celery's protocol 2
        out["eta"] = datetime.fromtimestamp(due_at / 1000, timezone.utc).isoformat()
    return out


def reschedule(connection: Any, ident: str, when: Union[Delay, datetime], *, limit: int = DEFAULT_LIMIT,
               clock: Callable[[], float] = time.time,
               progress: Optional[Callable[[Progress], None]] = None) -> Rescheduled:
    """Make the waiting message ``ident`` (a message id or a Celery task id) due at ``when``.

    ``when`` is an aware datetime or a delay from now (seconds or a timedelta); now,
    or the past, runs it now. The first message found with that id is moved. A message a
    relay holds for its last seconds (it is not in a queue then), or that was delivered
    already, is not found.

    Arguments:
        connection: a connected :class:`kombu.Connection`.
        ident: the id to look for.
        when: its new due time.
        limit: look at this many messages at most, over all the queues.
        clock: the time "now" is taken from (epoch seconds).
        progress: called about once a second on a long scan.

    Returns:
        A :class:`Rescheduled`; its ``found`` is None when no waiting message has the id.

    Raises:
        TypeError, ValueError: ``when`` or ``limit`` is not valid (naming it).
    """
    due_at = due_from(when, clock())
    copies: list[Optional[Entry]] = []

    def take(channel: Any, message: Any) -> None:
        _replace(channel, message, due_at)
        copies.append(_copy_entry(message, due_at, int(clock() * 1000)))

    result = find(connection, ident, limit=limit, queues=RESCHEDULED_QUEUES, progress=progress, take=take)
    moved = result.found[0] if result.found else None
    indexed = False
    if moved is not None:
        logger.info(I_MOVED, ident, moved.queue, moved.due_at, due_at)
        entries = [copy for copy in copies if copy is not None]
        indexed = bool(entries) and append_index(
            connection, entries, what=f"the index shows {ident} due at its old time until it falls due")
    return Rescheduled(moved, due_at, result.looked_at, result.seconds, result.truncated, indexed)


def _copy_entry(message: Any, due_at: int, now_ms: int) -> Optional[Entry]:
    """The index entry of ``message``'s copy due at ``due_at``, replacing its entry due at its old time."""
    try:
        headers = message.headers if isinstance(message.headers, Mapping) else {}
        properties = dict(getattr(message, "properties", None) or {})
        return entry_of(properties, headers, len(bytes_of(message.body)), at=now_ms, due=due_at,
                        was=parse_due_at(headers.get(DUE_AT)))
    except Exception:  # noqa: BLE001 - an untrusted message: it is moved all the same, only unindexed
        logger.debug("no index entry for a moved message", exc_info=True)
        return None


def _replace(channel: Any, message: Any, due_at: int) -> None:
    """In one transaction on ``channel``: publish ``message``'s copy due at ``due_at`` into the control queue,
    and ack ``message``."""
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    properties = dict(getattr(message, "properties", None) or {})
    for name in ("content_type", "content_encoding"):  # kombu keeps these beside its properties
        if properties.get(name) is None and getattr(message, name, None) is not None:
            properties[name] = getattr(message, name)
    copy = prepare_copy(channel, message.body, properties, moved_headers(headers, due_at))
    channel.tx_select()
    channel.basic_publish(copy, exchange="", routing_key=CONTROL)
    channel.basic_ack(message.delivery_tag)
    channel.tx_commit()
