"""Pure ladder arithmetic: due times, rung choice and hop forecasts (no I/O, no kombu)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from numbers import Real
from typing import Optional, Union

from .contract import RUNGS

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
]

#: What :func:`choose_rung` and :func:`place` return when no rung fits: deliver now.
DELIVER: None = None

#: The default longest delay accepted, in seconds: ten years, leap days included
#: (87,672 one-hour hops). It is no limit of the ladder, which hops any delay an hour at
#: a time as the AceMQ relays do; it catches unit mistakes (a due time in microseconds,
#: milliseconds passed as seconds). Change it with ``max_delay=`` (Celery: ``ladder_max_delay``).
MAX_DELAY = 3653 * 24 * 3600

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


def check_max_delay(value: object, *, argument: str = "max_delay") -> float:
    """Validate a maximum delay (seconds, or a timedelta) and return it in seconds.

    Raises:
        TypeError: ``value`` is not a real number or a timedelta, naming ``argument``.
        ValueError: ``value`` is not a finite number of seconds above zero.
    """
    seconds = _as_seconds(value, argument)
    if seconds <= 0:
        raise ValueError(f"{argument} must be a number of seconds above zero, not {value!r}")
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
