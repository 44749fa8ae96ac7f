"""What a relay has done (its counters) and where it may deliver (its allow-list)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..observe import REASONS, Lateness, reason_code

__all__ = ["AllowList", "Counters"]


class AllowList:
    """Which target exchanges a relay may deliver to.

    ``None`` (the default) allows every exchange. Otherwise only the exact
    names given are allowed; ``""`` stands for the default exchange.
    """

    def __init__(self, exchanges: Optional[Iterable[str]] = None) -> None:
        if isinstance(exchanges, str):
            raise TypeError("allowed_exchanges must be an iterable of exchange names, not a str")
        self.exchanges = None if exchanges is None else frozenset(exchanges)

    def __call__(self, exchange: str) -> bool:
        return self.exchanges is None or exchange in self.exchanges

    def __repr__(self) -> str:
        return f"AllowList({'*' if self.exchanges is None else sorted(self.exchanges)!r})"


@dataclass
class Counters:
    """What a relay has done, each counted once it happened (the broker confirmed it).

    Read from any thread; written by the relay's.
    """

    #: Expired messages taken from the control queue (one given back by the broker and taken
    #: again, after a lost connection, counts again).
    received: int = 0
    #: Deliveries the broker confirmed into their target.
    delivered: int = 0
    #: Confirmed publishes into a rung: hops, and retries of refused deliveries.
    hops: int = 0
    #: Parked messages whose envelope was malformed (also counted under ``parked``).
    malformed: int = 0
    #: Confirmed publishes into the parking queue: malformed, unroutable or refused messages.
    parked: int = 0
    #: Deliveries the broker refused (``basic.nack``, e.g. a full target queue with
    #: ``reject-publish``); each is retried or parked. Through an exchange with several
    #: queues, the others may have taken their copy.
    refused: int = 0
    #: Cancelled messages (their id is in ``ladder.cancellations``) acked and dropped, at a hop or at delivery.
    cancelled: int = 0
    #: ``parked`` by reason code (:data:`kombu_ladder.observe.REASONS`).
    parked_reasons: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    #: Lateness of the confirmed deliveries (delivery time minus due time).
    lateness: Lateness = field(default_factory=Lateness)

    def count_delivered(self, lateness: Optional[float]) -> None:
        """Count one confirmed delivery, ``lateness`` seconds after its due time (None: unknown)."""
        self.delivered += 1
        if lateness is not None:
            self.lateness.observe(lateness)

    def count_parked(self, reason: str) -> None:
        """Count one confirmed parking, under its reason's code (a malformed one under ``malformed`` too)."""
        code = reason_code(reason)
        self.parked += 1
        self.parked_reasons[code] += 1
        if code == "malformed":
            self.malformed += 1

    def as_dict(self) -> dict[str, int]:
        """Return the counters as a plain dict."""
        return {
            "received": self.received,
            "delivered": self.delivered,
            "hops": self.hops,
            "malformed": self.malformed,
            "parked": self.parked,
            "refused": self.refused,
            "cancelled": self.cancelled,
        }
