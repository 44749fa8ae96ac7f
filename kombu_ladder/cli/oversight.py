"""Command bodies for an operator's questions: is the ladder healthy (``check``), where is my message (``find``)."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any, Optional

import click

from ..depths import queue_depths
from ..health import DEFAULT_MAX_BACKLOG, cancellation_findings, healthy, queue_findings, relay_count, topology_findings
from ..peek import DEFAULT_LIMIT, FindResult, Progress, Sighting, find, live_cancellations, state_of
from ..rescheduling import Rescheduled, reschedule
from ..topology import resolve_queue_type
from .commands import CommandError, emit

__all__ = ["Unhealthy", "check_report", "check", "find_message", "move_message", "sighting_lines"]

I_HEALTHY = "ok: {}"
E_UNHEALTHY = "ladder unhealthy: {}"
E_NOT_FOUND = ("no waiting message has the id {ident!r}: looked at {looked_at} message(s) in the rungs, "
               "acemq.schedule.due and acemq.schedule.parked{more}; it may be delivered already, or at a relay "
               "on its way to its next queue")
E_TRUNCATED = " (stopped at --limit {limit})"
E_NOT_MOVED = ("nothing moved: no waiting message has the id {ident!r} in the rungs or acemq.schedule.due "
               "(looked at {looked_at} message(s){more}); it may be delivered already, or held by a relay for "
               "its last seconds")
I_MOVED = "moved {ident} (message {position} of {queue}) into acemq.schedule.due, due at its new time"
I_INDEXED = "the index of waiting work (ladder.index) shows the new due time from its next sync"
I_LOOKED = "looked at {looked_at} message(s) in {seconds:.2f} s; each one is back at its place"
I_PROGRESS = "looking into {queue}: {looked_at} of {depth} message(s)"


class Unhealthy(CommandError):
    """``check`` found a problem: one line saying which, exit status 1."""


def check_report(connection: Any, *, min_relays: int = 1, max_backlog: int = DEFAULT_MAX_BACKLOG,
                 max_parked: Optional[int] = None, queue_type: Optional[str] = None) -> dict[str, Any]:
    """Check the ladder's topology, its relays, the control queue's backlog (and the parked count, if asked),
    and that the relays can enforce cancellations.

    The topology is checked against ``queue_type``'s profile: by default the one it is declared with
    (see :func:`~kombu_ladder.topology.resolve_queue_type`).
    """
    depths = queue_depths(connection)
    findings = [*topology_findings(connection, queue_type=resolve_queue_type(connection, queue_type)),
                *queue_findings(depths, min_relays=min_relays, max_backlog=max_backlog, max_parked=max_parked),
                *cancellation_findings(connection, relays=relay_count(depths))]
    return {"ok": healthy(findings), "checks": [f.__dict__ for f in findings],
            "queues": [row._asdict() for row in depths]}


def check(connection: Any, *, min_relays: int = 1, max_backlog: int = DEFAULT_MAX_BACKLOG,
          max_parked: Optional[int] = None, as_json: bool = False, queue_type: Optional[str] = None) -> None:
    """Print one line (or a JSON document) on the ladder's health; fail with one line when it is unhealthy.

    Raises:
        Unhealthy: a check failed (exit status 1), the line naming every failure.
    """
    report = check_report(connection, min_relays=min_relays, max_backlog=max_backlog, max_parked=max_parked,
                          queue_type=queue_type)
    if as_json:
        emit(json.dumps(report, indent=2, sort_keys=True))
    if not report["ok"]:
        raise Unhealthy(E_UNHEALTHY.format("; ".join(c["detail"] for c in report["checks"] if not c["ok"])))
    if not as_json:
        emit(I_HEALTHY.format("; ".join(c["detail"] for c in report["checks"])))


def _when(due_at: Optional[int], now: float) -> str:
    if due_at is None:
        return "unknown (its x-schedule-due-at is unreadable)"
    stamp = datetime.datetime.fromtimestamp(due_at / 1000, tz=datetime.timezone.utc)
    ahead = due_at / 1000 - now
    relative = f"in {ahead:.1f} s" if ahead >= 0 else f"{-ahead:.1f} s ago"
    return f"{stamp.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}, {relative}"


def sighting_lines(sighting: Sighting, now: float, state: Optional[str] = None) -> list[str]:
    """Render where one message waits, its state, when it falls due and where it goes."""
    lines = [f"{sighting.queue}: message {sighting.position} of {sighting.depth}",
             *([f"state   {state}"] if state is not None else []),
             f"due     {_when(sighting.due_at, now)}",
             f"target  exchange {sighting.exchange!r}, routing key {sighting.routing_key!r}"]
    if sighting.task:
        lines.append(f"task    {sighting.task}[{sighting.task_id}]")
    if sighting.parked_reason:
        lines.append(f"parked  {sighting.parked_reason}")
    return lines


def _progress(step: Progress) -> None:
    click.echo(I_PROGRESS.format(queue=step.queue, looked_at=step.looked_at, depth=step.depth), err=True)


def move_message(connection: Any, ident: str, when: Any, *, limit: int = DEFAULT_LIMIT, as_json: bool = False,
                 quiet: bool = False) -> Rescheduled:
    """Make the waiting message ``ident`` due at ``when`` (seconds from now, or an aware datetime) and say so.

    Raises:
        CommandError: no waiting message has that id (exit status 1); nothing was moved.
    """
    result = reschedule(connection, ident, when, limit=limit, progress=None if quiet else _progress)
    now = time.time()
    if as_json:
        emit(json.dumps({"moved": result.found.__dict__ if result.found else None, "due_at": result.due_at,
                         "looked_at": result.looked_at, "seconds": round(result.seconds, 3),
                         "truncated": result.truncated, "indexed": result.indexed}, indent=2, sort_keys=True))
    if result.found is None:
        more = E_TRUNCATED.format(limit=limit) if result.truncated else ""
        raise CommandError(E_NOT_MOVED.format(ident=ident, looked_at=result.looked_at, more=more))
    if not as_json:
        emit(I_MOVED.format(ident=ident, queue=result.found.queue, position=result.found.position))
        emit(f"was due {_when(result.found.due_at, now)}")
        emit(f"now due {_when(result.due_at, now)}")
        if result.indexed:
            emit(I_INDEXED)
    return result


def find_message(connection: Any, ident: str, *, limit: int = DEFAULT_LIMIT, every: bool = False,
                 as_json: bool = False, quiet: bool = False) -> FindResult:
    """Print where the waiting message with id ``ident`` is (progress on stderr on a long scan).

    Raises:
        CommandError: no waiting message has that id (exit status 1).
    """
    result = find(connection, ident, limit=limit, first=not every, progress=None if quiet else _progress)
    now = time.time()
    if not result.found:
        more = E_TRUNCATED.format(limit=limit) if result.truncated else ""
        raise CommandError(E_NOT_FOUND.format(ident=ident, looked_at=result.looked_at, more=more))
    live = live_cancellations(connection)  # is it cancelled? as a relay would decide now
    states = [state_of(s, live, int(now * 1000)) for s in result.found]
    if as_json:
        emit(json.dumps({"found": [{**s.__dict__, "state": state} for s, state in zip(result.found, states)],
                         "looked_at": result.looked_at,
                         "seconds": round(result.seconds, 3), "truncated": result.truncated}, indent=2,
                        sort_keys=True))
        return result
    for index, sighting in enumerate(result.found):
        if index:
            emit()
        for line in sighting_lines(sighting, now, states[index]):
            emit(line)
    emit(I_LOOKED.format(looked_at=result.looked_at, seconds=result.seconds))
    return result
