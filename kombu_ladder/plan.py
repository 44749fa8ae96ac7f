"""All rung arithmetic, pure: due times, the contract's and the relay's rung choice, the hold window, due windows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from numbers import Real
from typing import Mapping, Optional, Union

from .contract import CONTROL, RUNGS, rung_name
from .tuning import HOLD_BYTES, HOLD_CAPACITY, HOLD_WINDOW, MAX_DELAY, MAX_HOLD_BYTES, TUNABLES

#: The checks of the options the arithmetic uses (declared in :mod:`kombu_ladder.tuning`).
check_max_delay = TUNABLES["max_delay"].check
check_hold_window = TUNABLES["hold_window"].check
check_hold_capacity = TUNABLES["hold_capacity"].check
check_hold_bytes = TUNABLES["hold_bytes"].check

__all__ = [
    "DELIVER",
    "MAX_DELAY",
    "Delay",
    "check_max_delay",
    "describe_limit",
    "choose_rung",
    "place",
    "hops_for",
    "parse_due_at",
    "delay_seconds",
    "due_at_ms",
    "to_millis",
    "HOLD",
    "HOLD_WINDOW",
    "HOLD_CAPACITY",
    "HOLD_BYTES",
    "MAX_HOLD_BYTES",
    "TOLERANCE_MIN_MS",
    "TOLERANCE_PPM",
    "Step",
    "tolerance_ms",
    "fit_rung",
    "relay_step",
    "step",
    "check_hold_window",
    "check_hold_capacity",
    "check_hold_bytes",
    "forecast",
    "HORIZONS",
    "DueBound",
    "due_window",
    "due_bounds",
]

#: What :func:`choose_rung` and :func:`place` return when no rung fits: deliver now.
DELIVER: None = None

#: A delay as the public API accepts it: seconds as a real number, or a timedelta.
Delay = Union[Real, int, float, timedelta]


def choose_rung(remaining_ms: int) -> Optional[int]:
    """Return the largest rung (in seconds) that does not overshoot, or :data:`DELIVER`.

    Arguments:
        remaining_ms: milliseconds until the message is due.

    Returns:
        The rung's length in seconds, or ``None`` when less than the smallest
        rung remains (or the message is already due).
    """
    for rung in RUNGS:
        if rung * 1000 <= remaining_ms:
            return rung
    return DELIVER


def place(due_at: int, now_ms: int) -> Optional[int]:
    """Return the rung a message due at ``due_at`` (epoch ms) goes into at ``now_ms``."""
    return choose_rung(due_at - now_ms)


def hops_for(delay: Delay, *, max_delay: float = MAX_DELAY) -> tuple[int, ...]:
    """Forecast the rungs a message passes through for ``delay``, in order.

    Assumes every rung expires exactly on time. ``hops_for(90)`` is
    ``(60, 10, 10, 10)``; an empty tuple means the message is delivered at once.
    """
    remaining = round(delay_seconds(delay, argument="delay", max_delay=max_delay) * 1000)
    hops: list[int] = []
    while True:
        rung = choose_rung(remaining)
        if rung is None:
            return tuple(hops)
        hops.append(rung)
        remaining -= rung * 1000


def parse_due_at(value: object) -> Optional[int]:
    """Read an ``x-schedule-due-at`` header leniently, as epoch milliseconds.

    An integer, or a string (or bytes) spelling an integer, is accepted.
    ``True``, ``False``, ``None``, floats, strings of floats and anything else
    come back as ``None``, which means malformed.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str):
        if not value.isascii():  # int() also reads other scripts' digits; Ruby's Integer() does not
            return None
        try:
            return int(value.strip(), 10)
        except ValueError:
            return None
    return None


def describe_limit(seconds: float) -> str:
    """Render a maximum delay for an error message: ``315619200s (3653 days)``."""
    return f"{seconds:.15g}s ({seconds / 86400:.15g} days)"


def _as_seconds(value: object, argument: str) -> float:
    """Return a real number of seconds or a timedelta as finite float seconds."""
    kind = type(value)
    if kind is int or kind is float:  # the common case, without the abstract-class checks below
        seconds = float(value)  # type: ignore[arg-type]  # an int or a float, checked just above
        if seconds - seconds != 0:  # NaN or an infinity
            raise ValueError(f"{argument} must be a finite number of seconds, not {value!r}")
        return seconds
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, Real) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(
            f"{argument} must be a number of seconds or a datetime.timedelta, "
            f"not {type(value).__name__}: {value!r}"
        )
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{argument} must be a finite number of seconds, not {value!r}")
    return seconds


def delay_seconds(delay: object, *, argument: str = "delay", max_delay: float = MAX_DELAY) -> float:
    """Validate a delay and return it in seconds.

    Arguments:
        delay: seconds as a real number, or a timedelta.
        argument: the name the error messages give ``delay``.
        max_delay: the longest delay accepted, in seconds (default :data:`MAX_DELAY`).

    Raises:
        TypeError: ``delay`` is not a real number or a timedelta.
        ValueError: ``delay`` is NaN, infinite or longer than ``max_delay``.
    """
    seconds = _as_seconds(delay, argument)
    if seconds > max_delay:
        raise ValueError(
            f"{argument}={seconds:.15g}s is longer than the maximum delay of {describe_limit(max_delay)}; "
            f"was it given in milliseconds? (raise the limit with max_delay=, in Celery ladder_max_delay)"
        )
    return seconds


def to_millis(moment: datetime, *, argument: str = "eta") -> int:
    """Return an aware datetime as epoch milliseconds.

    Raises:
        TypeError: ``moment`` is not a datetime.
        ValueError: ``moment`` is naive.
    """
    if not isinstance(moment, datetime):
        raise TypeError(
            f"{argument} must be a timezone-aware datetime, not {type(moment).__name__}: {moment!r}"
        )
    if moment.tzinfo is None or moment.tzinfo.utcoffset(moment) is None:
        raise ValueError(
            f"{argument} must be timezone-aware (for example datetime.now(timezone.utc)); "
            f"got the naive datetime {moment.isoformat()}"
        )
    return math.floor(moment.timestamp() * 1000)


def due_at_ms(
    now: float,
    *,
    countdown: Optional[Delay] = None,
    eta: Optional[datetime] = None,
    max_delay: float = MAX_DELAY,
) -> int:
    """Return the due time in epoch milliseconds from ``countdown`` or ``eta``.

    Arguments:
        now: the current time in epoch seconds.
        countdown: seconds (or a timedelta) from ``now``.
        eta: an aware datetime.
        max_delay: the longest delay accepted, in seconds (default :data:`MAX_DELAY`).

    Raises:
        ValueError: both or neither of ``countdown`` and ``eta`` were given, or
            either is out of range (see :func:`delay_seconds`, :func:`to_millis`).
        TypeError: either has the wrong type.
    """
    if (countdown is None) == (eta is None):
        raise ValueError("give exactly one of countdown= and eta=")
    now_ms = math.floor(now * 1000)
    if eta is not None:
        due = to_millis(eta, argument="eta")
        if due - now_ms > max_delay * 1000:
            raise ValueError(
                f"eta={eta.isoformat()} is more than the maximum delay of {describe_limit(max_delay)} ahead "
                f"(raise the limit with max_delay=, in Celery ladder_max_delay)"
            )
        return due
    return now_ms + round(delay_seconds(countdown, argument="countdown", max_delay=max_delay) * 1000)


# -- the relay's steps: the broker's expiry lag and the hold window --------------------------

#: The least a rung may overshoot what remains (ms): covers RabbitMQ's expiry lag of one hop
#: (2.5 ms median, 9 ms p99 measured on a quiet broker) with room to spare.
TOLERANCE_MIN_MS = 20

#: A rung may overshoot what remains by this many millionths of its length when that is more than
#: :data:`TOLERANCE_MIN_MS`: 90 ms for the 1 h rung, so that 24 one-hour hops, which each
#: expire a few ms late, still fit one hour each instead of stepping down at the last hour.
TOLERANCE_PPM = 25

class _Hold:
    """The outcome of :func:`step` meaning: keep the message unacked and deliver it at its due time."""

    def __repr__(self) -> str:
        return "HOLD"


#: What :func:`step` returns when the relay holds the message.
HOLD = _Hold()

#: One relay step: a rung (seconds), :data:`DELIVER` (None) now, or :data:`HOLD` until due.
Step = Union[int, None, _Hold]


def tolerance_ms(rung: int) -> int:
    """Return by how many ms rung ``rung`` (seconds) may overshoot what remains of a delay."""
    return max(TOLERANCE_MIN_MS, rung * 1000 * TOLERANCE_PPM // 1_000_000)


def fit_rung(remaining_ms: int) -> Optional[int]:
    """Return the largest rung no longer than ``remaining_ms`` plus its tolerance, or None (deliver).

    A rung expires a few ms late, so after a hop what remains falls just short of the
    next rung of the same length; the tolerance keeps it in that rung instead of
    stepping down a rung (and taking many small hops to make up the shortfall).
    """
    for rung in RUNGS:
        if rung * 1000 <= remaining_ms + tolerance_ms(rung):
            return rung
    return None


def step(remaining_ms: int, *, hold_window_ms: int = 0, can_hold: bool = False) -> Step:
    """Decide one relay step for a message with ``remaining_ms`` left before it is due.

    Returns:
        ``None`` to deliver now (it is due, or no rung fits and it cannot be held),
        :data:`HOLD` to hold it until due (less than ``hold_window_ms`` remains and
        ``can_hold``), else the rung (seconds) to put it in, per :func:`fit_rung`.
    """
    if remaining_ms <= 0:
        return None
    if remaining_ms < hold_window_ms and can_hold:
        return HOLD
    return fit_rung(remaining_ms)


def relay_step(remaining_ms: int, *, hold_window_ms: int, can_hold: bool) -> Step:
    """:func:`step` for a relay that holds: a message it cannot hold (no room) is never delivered early, so
    one with less than a second left takes the 1 s rung (up to a second late); with holding off
    (``hold_window_ms`` 0) it is :func:`step`, the contract's up to a second early."""
    decision = step(remaining_ms, hold_window_ms=hold_window_ms, can_hold=can_hold)
    if decision is None and remaining_ms > 0 and hold_window_ms and not can_hold:
        return 1
    return decision


def forecast(delay_ms: int, *, lag_ms: int = 0, hold_window_ms: int = 0) -> tuple[tuple[int, ...], int]:
    """Forecast the rungs a delay takes when every rung expires ``lag_ms`` late, and when it arrives.

    The first rung is the producer's (:func:`choose_rung`, no tolerance);
    every later step is the relay's (:func:`step`, holding without a capacity limit).

    Returns:
        The rungs in order, and the arrival relative to the due time in ms (negative: early).
    """
    rungs: list[int] = []
    elapsed = 0
    rung = choose_rung(delay_ms)
    while rung is not None:
        rungs.append(rung)
        elapsed += rung * 1000 + lag_ms
        decision = step(delay_ms - elapsed, hold_window_ms=hold_window_ms, can_hold=True)
        if decision is HOLD:
            return tuple(rungs), 0
        rung = decision if isinstance(decision, int) else None
    return tuple(rungs), elapsed - delay_ms


# -- when waiting messages fall due, from the rung depths alone ---------------------------------

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
