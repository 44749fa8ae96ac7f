"""Dead-lettering as RabbitMQ writes it (3.10, and 4.x's ``x-last-death-*``): the ``x-death`` table and cycles."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

__all__ = ["REASONS", "dead_letter_headers", "is_cycle"]

#: Why a message is dead-lettered (``reason`` in ``x-death``).
REASONS = frozenset({"rejected", "expired", "maxlen"})


def dead_letter_headers(
    headers: Optional[dict[str, Any]],
    *,
    queue: str,
    reason: str,
    exchange: str,
    routing_keys: list[str],
    now_ms: int,
    original_expiration: Optional[str] = None,
    last_death: bool = False,
) -> dict[str, Any]:
    """Return the headers of a message dead-lettered from ``queue``.

    As RabbitMQ 3.10 does it: the first death also writes
    ``x-first-death-reason``, ``-queue`` and ``-exchange``; ``x-death`` is a
    list of tables, newest first, one per (queue, reason), whose ``count``
    goes up (and which moves to the front) when the message dies the same way
    again. 3.10 writes no ``x-last-death-*`` headers; 4.x (``last_death``) sets
    ``x-last-death-reason``, ``-queue`` and ``-exchange`` at every death.
    """
    if reason not in REASONS:
        raise ValueError(f"reason must be one of {sorted(REASONS)}, not {reason!r}")
    out = dict(headers or {})
    info: dict[str, Any] = {
        "reason": reason,
        "queue": queue,
        "time": datetime.fromtimestamp(now_ms // 1000, tz=timezone.utc).replace(tzinfo=None),
        "exchange": exchange,
        "routing-keys": list(routing_keys),
    }
    if original_expiration is not None:
        info["original-expiration"] = original_expiration
    if last_death:
        out["x-last-death-reason"] = reason
        out["x-last-death-queue"] = queue
        out["x-last-death-exchange"] = exchange
    deaths = out.get("x-death")
    if not isinstance(deaths, list):
        out["x-first-death-reason"] = reason
        out["x-first-death-queue"] = queue
        out["x-first-death-exchange"] = exchange
        out["x-death"] = [{"count": 1, **info}]
        return out
    matches = [d for d in deaths if isinstance(d, dict) and d.get("queue") == queue and d.get("reason") == reason]
    others = [d for d in deaths if not any(d is m for m in matches)]
    if matches:
        entry = dict(matches[0])
        entry["count"] = int(entry.get("count", 0)) + 1
    else:
        entry = {"count": 1, **info}
    out["x-death"] = [dict(sorted(entry.items())), *others]
    return out


def is_cycle(target_queue: str, reason: str, headers: dict[str, Any]) -> bool:
    """Whether dead-lettering into ``target_queue`` closes an automatic cycle.

    RabbitMQ drops the message for that queue when the queue already appears
    in ``x-death`` and no death on the way back to it was a rejection. A
    rejection never counts as a cycle. ``headers`` already carries this death.
    """
    if reason == "rejected":
        return False
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return False
    path = []
    for death in deaths:
        path.append(death)
        if isinstance(death, dict) and death.get("queue") == target_queue:
            return all(isinstance(d, dict) and d.get("reason") != "rejected" for d in path)
    return False
