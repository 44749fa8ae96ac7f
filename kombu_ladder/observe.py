"""What a relay observes, in fixed shapes: park reason codes and the lateness histogram (no I/O)."""

from __future__ import annotations

import bisect
import threading
from typing import Any, Mapping, Optional

from .contract import DUE_AT
from .plan import parse_due_at

__all__ = ["REASONS", "LATENESS_BUCKETS", "Lateness", "reason_code", "lateness_seconds", "cancellations_enforced"]

#: Why a message was parked, as a small fixed set (a metric label, never free text). A park
#: reason starts with one of these followed by a colon; any other reason counts as ``other``.
REASONS: tuple[str, ...] = ("malformed", "unroutable", "refused", "other")

#: Upper bounds (seconds) of the lateness buckets: delivery time minus due time. Negative
#: bounds count early deliveries (the contract delivers up to one smallest rung early);
#: the bounds resolve milliseconds near zero and seconds to an hour either side.
LATENESS_BUCKETS: tuple[float, ...] = (
    -3600.0, -60.0, -10.0, -5.0, -2.5, -1.0, -0.5, -0.25, -0.1, -0.05, -0.025, -0.01, -0.005, -0.0025, -0.001,
    0.0,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 3600.0,
)


def reason_code(reason: str) -> str:
    """Return the code of a park reason: the word before its first colon, if it is one of :data:`REASONS`.

    >>> reason_code("unroutable: NO_ROUTE (exchange='billing', routing_key='x')")
    'unroutable'
    >>> reason_code("something new")
    'other'
    """
    code, colon, _ = reason.partition(":") if isinstance(reason, str) else ("", "", "")
    return code if colon and code in REASONS[:-1] else "other"


def cancellations_enforced(core: Any) -> bool:
    """Whether a relay (its :class:`~kombu_ladder.relay.RelayCore`) reads ``ladder.cancellations`` now, and so
    drops cancelled messages; False while it cannot (the stream refused, declared otherwise) or is not connected."""
    cancels = getattr(core, "cancels", None)
    return cancels is not None and bool(cancels.enforcing)


def lateness_seconds(headers: Optional[Mapping[str, Any]], now: float) -> Optional[float]:
    """Delivery time ``now`` (epoch seconds) minus the message's ``x-schedule-due-at``, in seconds.

    Returns ``None`` when the header is absent or unreadable (the relay parks such messages).
    """
    if not isinstance(headers, Mapping):
        return None
    due = parse_due_at(headers.get(DUE_AT)) if DUE_AT in headers else None
    return None if due is None else now - due / 1000.0


class Lateness:
    """A histogram of delivery lateness with the fixed :data:`LATENESS_BUCKETS` (thread-safe).

    Observed by the relay's thread, read by a metrics scrape on another: each
    read is a consistent snapshot.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Observations per bucket (not cumulative); the last slot is above the last bound.
        self._counts = [0] * (len(LATENESS_BUCKETS) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one delivery ``seconds`` late (negative: early)."""
        index = bisect.bisect_left(LATENESS_BUCKETS, seconds)
        with self._lock:
            self._counts[index] += 1
            self._sum += seconds

    def snapshot(self) -> tuple[list[int], float]:
        """Return the cumulative counts per bound (``+Inf`` last, which is the total) and the sum of observations."""
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        cumulative, running = [], 0
        for count in counts:
            running += count
            cumulative.append(running)
        return cumulative, total

    @property
    def count(self) -> int:
        """How many deliveries were observed."""
        with self._lock:
            return sum(self._counts)
