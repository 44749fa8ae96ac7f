"""What a relay has done (its counters) and where it may deliver (its allow-list)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

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
    """What a relay has done. Read from any thread; written by the relay's."""

    #: Expired messages received from the control queue.
    received: int = 0
    #: Messages delivered to their target (confirmed by the broker).
    delivered: int = 0
    #: Times a message was put back into a rung (confirmed).
    hops: int = 0
    #: Messages without valid schedule headers (they are parked, never dropped).
    malformed: int = 0
    #: Messages parked: malformed, unroutable or refused by the allow-list (confirmed).
    parked: int = 0

    def as_dict(self) -> dict[str, int]:
        """Return the counters as a plain dict."""
        return {
            "received": self.received,
            "delivered": self.delivered,
            "hops": self.hops,
            "malformed": self.malformed,
            "parked": self.parked,
        }
