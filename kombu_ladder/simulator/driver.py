"""SimulatedRelay: a ladder relay that the simulator's advance() runs in the calling thread."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Iterable, Optional

from ..contract import PREFETCH
from ..relay import Counters, RelayCore
from ..topology import declare

__all__ = ["SimulatedRelay"]


class SimulatedRelay:
    """The relay's own logic (:class:`~kombu_ladder.relay.RelayCore`) on a broker-driven connection.

    No thread: every :meth:`SimulatedBroker.advance` (or ``settle``) hands it
    what reached the control queue, and it republishes before the clock moves on.
    """

    def __init__(self, broker: Any, *, prefetch: int = PREFETCH,
                 allowed_exchanges: Optional[Iterable[str]] = None) -> None:
        self.broker = broker
        self.connection = broker.connection()
        declare(self.connection)
        self.channel = self.connection.channel()
        self.core = RelayCore(clock=broker.now, prefetch=prefetch, allowed_exchanges=allowed_exchanges)
        self.consumer = self.core.consumer(self.channel)
        self.consumer.consume()
        broker.drive(self.connection)
        broker.settle()

    @property
    def counters(self) -> Counters:
        """What the relay has done: received, delivered, hops, malformed, parked."""
        return self.core.counters

    def close(self) -> None:
        """Stop relaying; unacked expiries go back to the control queue."""
        self.connection.release()

    def __enter__(self) -> "SimulatedRelay":
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()
