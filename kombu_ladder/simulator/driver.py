"""SimulatedRelay: a ladder relay that the simulator's advance() runs in the calling thread."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Iterable, Optional

from ..contract import PREFETCH
from ..relay.driven import DrivenRelay, Driver

__all__ = ["SimulatedRelay"]


class SimulatedRelay(Driver):
    """The relay (a :class:`~kombu_ladder.relay.driven.DrivenRelay`) on a broker-driven connection.

    No thread: every :meth:`SimulatedBroker.advance` (or ``settle``) hands it
    what reached the control queue, and it republishes before the clock moves on.
    """

    def __init__(self, broker: Any, *, prefetch: int = PREFETCH,
                 allowed_exchanges: Optional[Iterable[str]] = None) -> None:
        self.broker = broker
        self.connection = broker.connection()
        self.relay = DrivenRelay(clock=broker.now, check_clock=broker.now, prefetch=prefetch,
                                 allowed_exchanges=allowed_exchanges)
        self.channel = self.connection.channel()
        self.consumer = self.relay.start(self.connection, self.channel)
        broker.drive(self.connection, tick=self.relay.tick)
        broker.settle()

    def close(self) -> None:
        """Stop relaying; unacked expiries go back to the control queue."""
        self.relay.close()
        self.connection.release()

    def __enter__(self) -> "SimulatedRelay":
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()
