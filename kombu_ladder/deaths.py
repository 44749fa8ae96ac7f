"""When a message entered the rung it just left, read from the ``x-death`` RabbitMQ wrote (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Optional

from . import wire
from .contract import RUNGS, rung_name
from .envelope import DEATH_HEADER

__all__ = ["RUNG_TTL_MS", "entered_rung_ms"]

#: Each rung's queue name and its TTL (ms).
RUNG_TTL_MS: dict[str, int] = {rung_name(seconds): seconds * 1000 for seconds in RUNGS}


def entered_rung_ms(headers: Optional[Mapping[str, Any]]) -> Optional[int]:
    """When (epoch ms, to the second, never later than it was) a message entered the rung it expired from.

    RabbitMQ writes the newest death first in ``x-death``: a table with the
    queue the message died in and the ``time`` (epoch seconds) it died. A rung
    dead-letters a message its TTL after taking it (a relay removes ``x-death``
    at every hop, so the newest entry is the rung just left; were it kept, an
    entry's time is its queue's *first* death, earlier still). ``headers`` is
    the relay's header view (``x-death`` a :class:`~kombu_ladder.wire.Nested`
    array) or plain decoded headers (a list of dicts).

    Returns None when the message carries no readable death from a rung
    (published straight to the control queue, a foreign or hostile header).
    """
    if headers is None:
        return None
    try:
        deaths = headers.get(DEATH_HEADER)
    except (wire.WireError, ValueError):
        return None
    newest = _first_table(deaths)
    if newest is None:
        return None
    ttl = RUNG_TTL_MS.get(newest.get("queue"))  # type: ignore[arg-type]
    died = newest.get("time")
    if ttl is None or not isinstance(died, int) or isinstance(died, bool) or died < 0:
        return None
    return died * 1000 - ttl


def _first_table(deaths: Any) -> Optional[dict[str, Any]]:
    """The first table of an ``x-death`` value: a Nested array from the wire, or a list of dicts."""
    if isinstance(deaths, list):
        first = deaths[0] if deaths else None
        if not isinstance(first, dict):
            return None
        died = first.get("time")
        if not isinstance(died, datetime):  # py-amqp reads a timestamp as a naive datetime in UTC
            return None
        return {"queue": first.get("queue"),
                "time": int((died if died.tzinfo else died.replace(tzinfo=timezone.utc)).timestamp())}
    if not isinstance(deaths, wire.Nested):
        return None
    item = deaths.item
    try:
        if item[:1] != b"A" or len(item) < 6 or item[5:6] != b"F":
            return None
        end = wire.item_end(item, 5, len(item))
        fields = dict(wire.read_table(item, 10, end))
        queue = wire.decode(fields[b"queue"]) if b"queue" in fields else None
        stamp = fields.get(b"time", b"")
        died = wire.decode(stamp) if stamp[:1] == b"T" else None  # a timestamp, and nothing else
    except (wire.WireError, ValueError, IndexError):
        return None
    return {"queue": queue, "time": died}
