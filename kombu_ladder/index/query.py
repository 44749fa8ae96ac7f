"""What an operator asks the index: filters, groupings and their SQL (pure: no I/O, no sqlite3 import)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

__all__ = ["BY", "Filter", "parse_when", "where", "group_sql", "hour_label", "WAITING"]

#: What ``count --by`` groups by: the hour a message falls due in (UTC), its target, its Celery task name.
BY = ("due-hour", "target", "task")

#: An entry is waiting when it is not due yet and not cancelled: a cancellation record names its message id
#: or task id and was written no earlier than :data:`~kombu_ladder.cancellation.records.SLACK` before the
#: entry was (the relays' rule: a cancellation applies to what was waiting when it was written). The store
#: marks ``cancelled`` as it reads the records.
WAITING = "e.due > :now AND e.cancelled = 0"

_RELATIVE = re.compile(r"^\s*([+-]?)\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


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


def parse_when(text: str, *, option: str, now_ms: int) -> int:
    """Epoch ms from an ISO 8601 time (a naive one is UTC) or a time relative to now (``+2h``, ``30m``, ``-1d``;
    a bare number is seconds, as ``reschedule``'s WHEN).

    Raises:
        ValueError: neither; the message names ``option``.
    """
    found = _RELATIVE.match(text)
    if found:
        sign = -1 if found.group(1) == "-" else 1
        return now_ms + sign * int(float(found.group(2)) * _UNITS[found.group(3)] * 1000)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{option}: {text!r} is neither an ISO 8601 time (2026-12-02T03:00, UTC unless it "
                         f"says otherwise) nor a time from now (+2h, 30m, -1d, or seconds)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


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
