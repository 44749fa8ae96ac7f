"""What an operator asks the index: filters, groupings and their SQL (pure: no I/O, no sqlite3 import)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from ..times import parse_when

__all__ = ["BY", "Filter", "parse_when", "where", "group_sql", "hour_label", "WAITING", "MINUTE", "HOUR", "TALLIES",
           "due_range", "split", "parts", "tally_where", "tally_group_sql"]

#: What ``count --by`` groups by: the hour a message falls due in (UTC), its target, its Celery task name.
BY = ("due-hour", "target", "task")

#: An entry is waiting when it is not due yet and not cancelled: a cancellation record names its message id
#: or task id and was written no earlier than :data:`~kombu_ladder.cancellation.records.SLACK` before the
#: entry was (the relays' rule: a cancellation applies to what was waiting when it was written). The store
#: marks ``cancelled`` as it reads the records.
WAITING = "e.due > :now AND e.cancelled = 0"
#: The widths (ms) of the store's tallies' buckets: a count reads whole hours from one, whole minutes of the hours
#: at its ends from the other, and the entries of the minutes at its ends.
MINUTE = 60_000
HOUR = 3_600_000
#: The tally tables, each with the width of its buckets (ms).
TALLIES = {"tally_minute": MINUTE, "tally_hour": HOUR}

#: A range of due times, ``[start, end)`` in epoch ms; None is unbounded.
Span = tuple[Optional[int], Optional[int]]


@dataclass(frozen=True)
class Filter:
    """Which entries a list, count or bulk cancel covers (None: any)."""

    #: Due strictly before / at or after (epoch ms).
    due_before: Optional[int] = None
    due_after: Optional[int] = None
    #: The target exchange ("" is the default exchange) and routing key.
    exchange: Optional[str] = None
    routing_key: Optional[str] = None
    #: The Celery task name.
    task: Optional[str] = None
    #: Include what is no longer waiting (due already, or cancelled).
    everything: bool = False


def where(found: Filter, now_ms: int) -> tuple[str, dict[str, Any]]:
    """The SQL condition on ``entries e`` and its named parameters for ``found`` at ``now_ms``."""
    parts: list[str] = []
    params: dict[str, Any] = {"now": now_ms}
    if not found.everything:
        parts.append(WAITING)
    for field, column, op in (("due_before", "e.due", "<"), ("due_after", "e.due", ">="),
                              ("exchange", "e.exchange", "="), ("routing_key", "e.routing_key", "="),
                              ("task", "e.task", "=")):
        value = getattr(found, field)
        if value is not None:
            parts.append(f"{column} {op} :{field}")
            params[field] = value
    return (" AND ".join(parts) or "1"), params


def group_sql(by: str) -> tuple[str, ...]:
    """The SQL expressions an entry is grouped by for ``count --by``.

    Raises:
        ValueError: ``by`` is not one of :data:`BY`; the message names ``--by``.
    """
    if by == "due-hour":
        return ("(e.due / 3600000) * 3600000",)
    if by == "target":
        return ("e.exchange", "e.routing_key")
    if by == "task":
        return ("e.task",)
    raise ValueError(f"--by: {by!r} is not one of {', '.join(BY)}")


def hour_label(ms: int) -> str:
    """An hour's start (epoch ms) as the operator reads it: ``2026-12-02T03:00Z``."""
    return (datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%MZ")


def due_range(found: Filter, now_ms: int) -> Span:
    """The due times ``found`` covers at ``now_ms``: ``[start, end)``, None unbounded (waiting: due after now)."""
    start = found.due_after
    if not found.everything:
        start = now_ms + 1 if start is None else max(start, now_ms + 1)
    return start, found.due_before


def split(span: Span, width: int = MINUTE) -> tuple[list[Span], Span]:
    """``span`` as its ends that do not cover a whole bucket of ``width`` (read from the entries, each within one
    bucket) and the whole buckets between them, ``[first, end)`` in bucket numbers (read from the tally; empty
    when ``first >= end``)."""
    start, end = span
    if start is not None and end is not None and end <= start:
        return [], (0, 0)
    first = None if start is None else -(-start // width)  # the first whole bucket
    last = None if end is None else end // width  # the buckets before it are whole
    if first is not None and last is not None and first >= last:  # none whole: read it all from the entries
        return [(start, end)], (first, first)
    ends: list[Span] = []
    if first is not None and start % width:  # type: ignore[operator]
        ends.append((start, first * width))
    if last is not None and end % width:  # type: ignore[operator]
        ends.append((last * width, end))
    return ends, (first, last)


def parts(span: Span, *, hours: bool = True) -> list[tuple[str, Optional[int], Optional[int]]]:
    """Where the store reads each part of ``span``: ``(source, first, end)``, the source ``entries`` (bounds in ms)
    or a table of :data:`TALLIES` (bounds in its buckets); ``hours=False`` reads no whole hour from its tally."""
    ends, minutes = split(span, MINUTE)
    found: list[tuple[str, Optional[int], Optional[int]]] = [("entries", start, end) for start, end in ends]
    if minutes[0] is not None and minutes[1] is not None and minutes[0] >= minutes[1]:
        return found
    if not hours:
        return [*found, ("tally_minute", *minutes)]
    minute_ends, whole_hours = split(minutes, HOUR // MINUTE)
    found += [("tally_minute", start, end) for start, end in minute_ends]
    if whole_hours[0] is None or whole_hours[1] is None or whole_hours[0] < whole_hours[1]:
        found.append(("tally_hour", *whole_hours))
    return found


def tally_where(found: Filter, first: Optional[int], end: Optional[int]) -> tuple[str, dict[str, Any]]:
    """The SQL condition on a tally ``t`` for ``found`` over its buckets ``[first, end)`` (None: unbounded)."""
    parts = [] if found.everything else ["t.cancelled = 0"]
    params: dict[str, Any] = {}
    for name, bound, op in (("first", first, ">="), ("end", end, "<")):
        if bound is not None:
            parts.append(f"t.bucket {op} :{name}")
            params[name] = bound
    for field, column in (("exchange", "t.exchange"), ("routing_key", "t.routing_key"), ("task", "t.task")):
        value = getattr(found, field)
        if value is not None:
            parts.append(f"{column} = :{field}")
            params[field] = value
    if found.task is not None:
        parts.append("t.named = 1")
    return (" AND ".join(parts) or "1"), params


def tally_group_sql(by: str, width: int) -> tuple[str, ...]:
    """The SQL expressions a row of a tally of buckets ``width`` ms wide is grouped by for ``count --by`` (as
    :func:`group_sql` for an entry).

    Raises:
        ValueError: ``by`` is not one of :data:`BY`; the message names ``--by``.
    """
    if by == "due-hour":
        return (f"(t.bucket * {width} / {HOUR}) * {HOUR}",)
    if by == "target":
        return ("t.exchange", "t.routing_key")
    if by == "task":
        return ("CASE WHEN t.named THEN t.task END",)
    raise ValueError(f"--by: {by!r} is not one of {', '.join(BY)}")
