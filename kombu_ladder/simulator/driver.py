"""SimulatedRelay: a ladder relay that the simulator's advance() runs in the calling thread."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Iterable, Optional

from ..contract import PREFETCH
from ..relay import Counters, RelayCore
from ..targets import ExchangeCheck
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
        #: Asks about target exchanges on a connection of its own, as the real relays do.
        self.exchange_check = ExchangeCheck(broker.connection(), clock=broker.now)
        self.core = RelayCore(clock=broker.now, prefetch=prefetch, allowed_exchanges=allowed_exchanges,
                              exchange_check=self.exchange_check)
        self.consumer = self.core.consumer(self.channel)
        self.consumer.consume()
        broker.drive(self.connection, tick=self.core.tick)
        broker.settle()

    @property
    def counters(self) -> Counters:
        """What the relay has done: received, delivered, hops, malformed, parked."""
        return self.core.counters

    def close(self) -> None:
        """Stop relaying; unacked expiries go back to the control queue."""
        self.exchange_check.close()
        self.connection.release()

    def __enter__(self) -> "SimulatedRelay":
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()
