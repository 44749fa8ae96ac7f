"""What an operator asks the index: filters, groupings and their SQL (pure: no I/O, no sqlite3 import)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from ..times import parse_when

__all__ = ["BY", "Filter", "parse_when", "where", "group_sql", "hour_label", "WAITING"]

#: What ``count --by`` groups by: the hour a message falls due in (UTC), its target, its Celery task name.
BY = ("due-hour", "target", "task")

#: An entry is waiting when it is not due yet and not cancelled: a cancellation record names its message id
#: or task id and was written no earlier than :data:`~kombu_ladder.cancellation.records.SLACK` before the
#: entry was (the relays' rule: a cancellation applies to what was waiting when it was written). The store
#: marks ``cancelled`` as it reads the records.
WAITING = "e.due > :now AND e.cancelled = 0"


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
