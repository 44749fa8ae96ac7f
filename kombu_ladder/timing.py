"""Pure relay timing: rung choice that allows for the broker's expiry lag, and the hold window (no I/O)."""

from __future__ import annotations

from typing import Optional, Union

from .contract import RUNGS

__all__ = [
    "HOLD",
    "HOLD_WINDOW",
    "HOLD_CAPACITY",
    "TOLERANCE_MIN_MS",
    "TOLERANCE_PPM",
    "Hold",
    "tolerance_ms",
    "fit_rung",
    "step",
    "check_hold_window",
    "check_hold_capacity",
    "forecast",
]

#: The least a rung may overshoot what remains (ms): covers RabbitMQ's expiry lag of one hop
#: (2.5 ms median, 9 ms p99 measured on a quiet broker) with room to spare.
TOLERANCE_MIN_MS = 20

#: A rung may overshoot what remains by this many millionths of its length when that is more than
#: :data:`TOLERANCE_MIN_MS`: 90 ms for the 1 h rung, so that 24 one-hour hops, which each
#: expire a few ms late, still fit one hour each instead of stepping down at the last hour.
TOLERANCE_PPM = 25

#: Seconds: what remains below this is held by the relay and delivered at its due time. 10 s is
#: the 10 s rung: no message ever takes a 1 s hop, and a held message waits at most 10 s (far
#: below RabbitMQ's 30 min ``consumer_timeout``). Change it with ``hold_window=`` (Celery:
#: ``ladder_hold_window``); 0 turns holding off (deliveries are then up to 1 s early, as AceMQ's).
HOLD_WINDOW = 10.0

#: Messages one relay holds at most; beyond that it falls back to the 1 s rung (and its prefetch
#: is this much larger than the contract's 50, so that held messages never stall the hops).
HOLD_CAPACITY = 2000


class Hold:
    """The outcome of :func:`step` meaning: keep the message unacked and deliver it at its due time."""

    def __repr__(self) -> str:
        return "HOLD"


#: What :func:`step` returns when the relay holds the message.
HOLD = Hold()


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


def step(remaining_ms: int, *, hold_window_ms: int = 0, can_hold: bool = False) -> Union[int, None, Hold]:
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


def check_hold_window(value: object, *, argument: str = "hold_window") -> float:
    """Validate a hold window in seconds (0 turns holding off) and return it.

    Raises:
        TypeError: not a real number, naming ``argument``.
        ValueError: negative, not finite, or longer than 600 s (held messages are unacked
            and RabbitMQ's ``consumer_timeout`` is 30 min by default).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}: {value!r}")
    seconds = float(value)
    if not 0 <= seconds <= 600:
        raise ValueError(f"{argument} must be between 0 and 600 seconds (0 turns holding off), not {value!r}")
    return seconds


def check_hold_capacity(value: object, *, argument: str = "hold_capacity") -> int:
    """Validate how many messages a relay may hold (a non-negative integer) and return it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{argument} must be a non-negative integer, not {value!r}")
    return value


def forecast(delay_ms: int, *, lag_ms: int = 0, hold_window_ms: int = 0) -> tuple[tuple[int, ...], int]:
    """Forecast the rungs a delay takes when every rung expires ``lag_ms`` late, and when it arrives.

    The first rung is the producer's (:func:`kombu_ladder.plan.choose_rung`, no tolerance);
    every later step is the relay's (:func:`step`, holding without a capacity limit).

    Returns:
        The rungs in order, and the arrival relative to the due time in ms (negative: early).
    """
    from .plan import choose_rung

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
