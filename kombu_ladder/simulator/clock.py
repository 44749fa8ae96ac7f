"""The simulator's virtual clock: integer milliseconds that move only when told to."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Optional, Union

__all__ = ["VirtualClock"]

#: Added to :meth:`VirtualClock.now` so that ``int(now() * 1000)`` and
#: ``math.floor(now() * 1000)`` give back the exact virtual millisecond: a bare
#: ``ms / 1000`` can land a hair below it in binary floating point.
_NUDGE = 5e-6


class VirtualClock:
    """Virtual epoch time at millisecond resolution (RabbitMQ's TTL resolution).

    Arguments:
        start: epoch seconds or an aware datetime; the default is the real
            time now, rounded down to the second.
    """

    def __init__(self, start: Optional[Union[float, datetime]] = None) -> None:
        if start is None:
            start = math.floor(time.time())
        if isinstance(start, datetime):
            if start.tzinfo is None or start.tzinfo.utcoffset(start) is None:
                raise ValueError("start must be a timezone-aware datetime")
            start = start.timestamp()
        if isinstance(start, bool) or not isinstance(start, (int, float)) or not math.isfinite(start):
            raise TypeError(f"start must be epoch seconds or an aware datetime, not {start!r}")
        #: The current virtual time, in epoch milliseconds.
        self.ms = math.floor(start * 1000)

    def now(self) -> float:
        """Return the virtual time in epoch seconds."""
        return self.ms / 1000 + _NUDGE

    def datetime(self) -> datetime:
        """Return the virtual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.ms / 1000, tz=timezone.utc)

    def move_to(self, ms: int) -> None:
        """Set the time to ``ms`` (epoch milliseconds); time never goes backwards."""
        if ms > self.ms:
            self.ms = ms

    @staticmethod
    def to_ms(seconds: object, *, argument: str = "seconds") -> int:
        """Validate a non-negative duration in seconds and return it in milliseconds."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"{argument} must be a number of seconds, not {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"{argument} must be a finite, non-negative number of seconds, not {seconds!r}")
        return round(seconds * 1000)
