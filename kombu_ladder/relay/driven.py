"""DrivenRelay: the one relay object (declare, exchange check, consume, drain on stop) for any driver."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable, Iterable, Optional

from ..contract import PREFETCH
from ..errors import TopologyConflict
from ..plan import MAX_DELAY
from ..targets import ExchangeCheck
from ..timing import HOLD_CAPACITY, HOLD_WINDOW
from ..topology import declare
from .core import RelayConsumer, RelayCore
from .counters import Counters

__all__ = ["DrivenRelay", "Driver", "STOP_GRACE", "TICK"]

logger = logging.getLogger("kombu_ladder.relay")

I_STOPPED = "relay stopped: %s"
E_CONFLICT = "ladder relay not started: the broker's ladder topology conflicts with the contract: %s"

#: Seconds a stopping relay waits for outstanding confirms, so a clean stop duplicates nothing.
STOP_GRACE = 5.0

#: Seconds between the ticks (back-offs, log summaries) of a relay :meth:`DrivenRelay.run_on` a loop.
TICK = 1.0

#: ``later(seconds, function)``: run ``function`` once, ``seconds`` from now, where the relay's frames are read.
Later = Callable[[float, Callable[[], None]], object]


class DrivenRelay:
    """The relay on a connection that something else drives: a consumer loop, a worker, the simulator.

    It owns what every relay does around :class:`~kombu_ladder.relay.RelayCore`:
    declaring the ladder on each (re)connection, the target-exchange check on a
    connection of its own, consuming ``acemq.schedule.due``, waiting for
    outstanding confirms when it stops, and its counters, which outlive
    reconnects. The driver reads the connection's frames and calls
    :meth:`tick` about once a second. The standalone
    :class:`~kombu_ladder.relay.Relay`, the Celery bootstep and the simulator's
    relay all drive one of these.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        max_delay: float = MAX_DELAY,
        counters: Optional[Counters] = None,
        check_clock: Callable[[], float] = time.monotonic,
        declare_topology: Callable[[Any], object] = declare,
        hold_window: float = HOLD_WINDOW,
        hold_capacity: int = HOLD_CAPACITY,
    ) -> None:
        self.core = RelayCore(clock=clock, prefetch=prefetch, allowed_exchanges=allowed_exchanges,
                              counters=counters, max_delay=max_delay, hold_window=hold_window,
                              hold_capacity=hold_capacity)
        #: Parks deliveries to a missing exchange (or one the relay may not write) before a publish there
        #: would close the relay's channel; made on the first :meth:`attach` (see kombu_ladder.targets).
        self.exchange_check: Optional[ExchangeCheck] = None
        self._check_clock = check_clock
        self._declare = declare_topology
        self._consumer: Optional[RelayConsumer] = None
        self._later: Optional[Later] = None

    @property
    def counters(self) -> Counters:
        """What the relay has done: received, delivered, hops, malformed, parked, refused."""
        return self.core.counters

    @property
    def outstanding(self) -> int:
        """Publishes not yet confirmed by the broker."""
        return self.core.outstanding

    def attach(self, connection: Any, channel: Any) -> RelayConsumer:
        """Declare the ladder on ``channel`` and return the consumer for it (not consuming yet).

        Raises:
            TopologyConflict: the broker's ladder conflicts with the contract.
        """
        if self.exchange_check is None:
            self.exchange_check = ExchangeCheck(connection.clone(), clock=self._check_clock)
        self.exchange_check.forget()  # (re)connecting: an exchange may have gone meanwhile
        self.core.exchange_check = self.exchange_check
        self._declare(channel)
        self._consumer = self.core.consumer(channel)
        return self._consumer

    def start(self, connection: Any, channel: Any) -> RelayConsumer:
        """:meth:`attach`, then consume: the relay takes expiries from now on."""
        consumer = self.attach(connection, channel)
        consumer.consume()  # the core logs "ladder relay consuming" once it consumes (after the cancellations)
        return consumer

    def run_on(self, connection: Any, channel: Any, later: Later) -> bool:
        """:meth:`start` in a loop that schedules with ``later`` (a Celery worker's hub or timer): a :meth:`tick`
        every ``TICK`` (1) seconds, and each held message published at its due time. Until :meth:`stop`.

        Returns:
            False, with the reason logged, when the broker's ladder conflicts with the contract.
        """
        try:
            self.start(connection, channel)
        except TopologyConflict as exc:
            logger.error(E_CONFLICT, exc)
            return False
        self._later = later
        if self.core.wakeup is None:  # the simulator's virtual timers, when it is one, were set by start()
            self.core.wake_with(later)

        def tick_again() -> None:
            if self._later is later:  # neither stopped nor started again since
                self.tick()
                later(TICK, tick_again)

        later(TICK, tick_again)
        return True

    def tick(self) -> None:
        """Send again what waited for its back-off; write the log summaries that are due."""
        self.core.tick()

    def drain(self, connection: Any, grace: float = STOP_GRACE) -> None:
        """Wait up to ``grace`` seconds for outstanding confirms, then close the publishing channel.

        ``connection`` is the one whose frames carry the confirms (None: do not wait).
        """
        deadline = time.monotonic() + grace
        while self.core.outstanding and connection is not None and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=0.1)
            except (socket.timeout, TimeoutError):
                continue
            except Exception:  # noqa: BLE001 - a dying connection: the broker requeues what is left
                break
        self.core.close()

    def stop(self, connection: Any, grace: float = STOP_GRACE) -> None:
        """Stop taking expiries and ticking, :meth:`drain`, and close the consuming channel (held messages go
        back to the broker)."""
        if self._later is not None:
            self._later = None
            self.core.wake_with(None)
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        channel = consumer.channel
        _quietly(consumer.cancel, "cancelling the relay consumer")
        self.drain(connection, grace)
        if channel is not None:
            _quietly(channel.close, "closing the relay's channel")
        logger.info(I_STOPPED, self.counters.as_dict())

    def close(self) -> None:
        """Close the exchange check's connection (it reconnects if the relay starts again)."""
        if self.exchange_check is not None:
            self.exchange_check.close()


class Driver:
    """What a driver of a :class:`DrivenRelay` (held as ``self.relay``) shows of it."""

    relay: DrivenRelay

    @property
    def core(self) -> RelayCore:
        """The relay's logic (see :class:`~kombu_ladder.relay.RelayCore`)."""
        return self.relay.core

    @property
    def exchange_check(self) -> Optional[ExchangeCheck]:
        """The target-exchange check, on a connection of its own (None before the relay first connects)."""
        return self.relay.exchange_check

    @property
    def counters(self) -> Counters:
        """What the relay has done: received, delivered, hops, malformed, parked, refused."""
        return self.relay.counters


def _quietly(action: Callable[[], object], what: str) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - a lost connection: the broker requeues what was taken
        logger.debug("%s failed", what, exc_info=True)
