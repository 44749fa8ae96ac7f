"""When the waiting messages fall due, bounded from the rung depths alone (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from .contract import CONTROL, RUNGS, rung_name

__all__ = ["HORIZONS", "DueBound", "due_window", "due_bounds"]

#: The horizons ``status --due`` answers for: seconds ahead, and how they are shown.
HORIZONS: tuple[tuple[int, str], ...] = ((60, "1 minute"), (3600, "1 hour"), (86400, "1 day"))


@dataclass(frozen=True)
class DueBound:
    """How many waiting messages fall due within ``seconds`` (None: beyond the last horizon)."""

    seconds: Optional[int]
    label: str
    at_least: int
    at_most: int


def due_window(queue: str) -> Optional[float]:
    """Seconds from now within which every message of ``queue`` falls due; None when unbounded.

    A message goes into the longest rung that does not overshoot its due time, so it
    entered rung T with less than the next longer rung's TTL to go, and falls due
    before that TTL has passed from now. The longest rung (1 h) holds anything from
    now to the maximum delay, and so does ``acemq.schedule.due``, whose messages came
    from any rung. Every message may also fall due at once, so no window has a lower bound.
    """
    longer: Optional[float] = None
    for seconds in RUNGS:  # longest first
        if rung_name(seconds) == queue:
            return longer
        longer = seconds
    if queue == CONTROL:
        return None
    raise ValueError(f"{queue!r} is not a rung or the control queue")


def due_bounds(depths: Mapping[str, Optional[int]]) -> list[DueBound]:
    """Bound how many messages fall due within each of :data:`HORIZONS`, and beyond the last.

    Arguments:
        depths: messages in each rung and in ``acemq.schedule.due`` (a missing queue: None or absent).

    Returns:
        One :class:`DueBound` per horizon, then one for beyond the last horizon.
    """
    windows = {queue: due_window(queue) for queue in (*(rung_name(r) for r in RUNGS), CONTROL)}
    counts = {queue: depths.get(queue) or 0 for queue in windows}
    total = sum(counts.values())
    def surely_within(seconds: float) -> int:
        return sum(n for q, n in counts.items() if (w := windows[q]) is not None and w <= seconds)

    bounds = [DueBound(seconds, label, surely_within(seconds), total) for seconds, label in HORIZONS]
    last, label = HORIZONS[-1]
    return [*bounds, DueBound(None, f"more than {label}", 0, total - surely_within(last))]


#: ``status --due``: the table's header and row, and what the bounds mean.
I_DUE_ROW = "{:<18} {:>9} {:>9}"
I_DUE_NOTE = ("bounds from the rung depths alone: a rung's messages fall due before the next",
              "longer rung's TTL has passed; the 1h rung and acemq.schedule.due may hold any due time")


def due_lines(bounds: list[DueBound]) -> list[str]:
    """Render :func:`due_bounds` as a table with a note on how exact it is."""
    lines = [I_DUE_ROW.format("falls due within", "at least", "at most")]
    lines += [I_DUE_ROW.format(b.label, b.at_least, b.at_most) for b in bounds]
    return [*lines, *I_DUE_NOTE]
