"""Relay: the one relay object, run by a loop of its own, by a worker's event loop, or by the simulator."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from itertools import count
from typing import Any, Callable, Iterator, Optional

from kombu.mixins import ConsumerMixin

from ..errors import TopologyConflict
from ..frames import read_in_bulk
from ..link import clock_of, link_for
from ..targets import ExchangeCheck
from ..topology import declare
from .core import RelayCore
from .counters import Counters
from .options import RelayOptions, taking_options

__all__ = ["Relay", "Later", "StopSignals", "STOP_GRACE", "TICK", "PAUSE_AT", "PHASES"]

logger = logging.getLogger("kombu_ladder.relay")

I_STOPPED = "relay stopped: %s"
I_COUNTERS = "relay counters: %s"
I_SIGNAL = "received %s, stopping the relay"
I_SIGNAL_EARLY = "received %s before the relay started: nothing taken, exiting"
W_PAUSED = "relay paused at %s (%s): waiting for a signal"
E_CONFLICT = "ladder relay not started: the broker's ladder topology conflicts with the contract: %s"

#: Seconds a stopping relay waits at most for outstanding confirms, so a clean stop duplicates nothing: it
#: stops waiting as soon as none is outstanding (the window's 1 MiB bodies took 11 s on a loaded broker).
STOP_GRACE = 30.0
#: Seconds between the ticks (back-offs, log summaries) of a relay :meth:`Relay.run_on` a loop.
TICK = 1.0
#: Seconds between the ticks of a relay running its own loop, at the most.
LOOP_TICK = 0.25

#: ``later(seconds, function)``: run ``function`` once, ``seconds`` from now, where the relay's frames are read.
Later = Callable[[float, Callable[[], None]], object]

#: The signals that stop a relay cleanly.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The moments of a standalone relay's life a stop signal may land in, in order: before its signal handlers
#: exist, connected and declared but not consuming, reading the cancellations before it consumes, holding
#: messages, and giving them back as it stops.
PHASES = ("before-signals", "connected", "catching-up", "holding", "putting-back")
#: For tests: the phases (comma-separated) at which a relay logs :data:`W_PAUSED` and waits for the next
#: signal, so a test can stop it at exactly that moment, whatever the machine's load.
PAUSE_AT = "LADDER_RELAY_PAUSE_AT"
_paused: set[str] = set()


def pause_at(phase: str, received: Callable[[], int]) -> None:
    """If :data:`PAUSE_AT` names ``phase`` (once per process): log it, and wait until ``received()`` (the stop
    signals counted so far) grows. Main thread only (``signal.pause``); a no-op unless the variable is set."""
    if phase in _paused or phase not in os.environ.get(PAUSE_AT, "").split(","):
        return
    _paused.add(phase)
    seen = received()
    logger.warning(W_PAUSED, phase, PAUSE_AT)
    while received() == seen:
        signal.pause()


class _Stopped(Exception):
    """A stop was asked for while the relay was (re)connecting."""


class StopSignals:
    """SIGTERM and SIGINT as a request to stop a standalone relay; :meth:`install` them before anything else.

    Until a relay is :meth:`attach`-ed (the start: reading options, connecting to resolve the queue type) a
    signal ends the process at once with exit status 0: nothing has been taken yet. Afterwards it only asks
    the relay to stop: the loop ends at its next turn (within a second), gives back what it holds and waits
    for the confirms of what it published. The handler does no I/O, so it never interleaves with the frames
    the relay is writing or reading.
    """

    def __init__(self) -> None:
        #: Stop signals received so far.
        self.received = 0
        self._relay: Optional["Relay"] = None

    def install(self) -> "StopSignals":
        """Install the handlers (main thread only); return self."""
        pause_at("before-signals", lambda: self.received)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        return self

    def attach(self, relay: "Relay") -> None:
        """From now on a signal stops ``relay``."""
        self._relay = relay
        relay.signals = self

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received += 1
        relay = self._relay
        if relay is None:
            logger.info(I_SIGNAL_EARLY, signal.Signals(signum).name)
            raise SystemExit(0)
        logger.info(I_SIGNAL, signal.Signals(signum).name)
        relay.should_stop = True


class Relay(ConsumerMixin):
    """The ladder's relay: everything a relay does around its :class:`~kombu_ladder.relay.RelayCore`.

    It declares the ladder on each (re)connection, checks target exchanges on a
    connection of its own, consumes ``acemq.schedule.due``, waits for outstanding
    confirms when it stops, and keeps its counters across reconnects. Its
    tuning is one :class:`~kombu_ladder.relay.RelayOptions` (``options``, or the
    options as keywords). Three ways to drive it:

    * :meth:`run`: on ``connection``, reconnecting by itself (kombu's
      ``ConsumerMixin`` loop), until :meth:`stop` from another thread or a signal
      handler; :meth:`run_until_signalled` stops on SIGTERM or SIGINT.
    * :meth:`run_on`: in a loop that schedules with ``later`` (a Celery worker's hub).
    * :meth:`start` and :meth:`tick`: by whatever reads the connection's frames
      (the simulator's ``SimulatedBroker.host``).

    Raises:
        TypeError, ValueError: an option is unknown or out of range (the message names it).
    """

    @taking_options
    def __init__(self, connection: Any = None, *, options: Optional[RelayOptions] = None,
                 clock: Optional[Callable[[], float]] = None, counters: Optional[Counters] = None,
                 report_every: Optional[float] = None, **values: Any) -> None:
        #: The connection the relay runs on: the one given, else the one it was last started on.
        self.connection = connection
        #: The relay's tuning, validated once.
        self.options = RelayOptions.of(options, **values)
        if connection is not None:
            clock = clock_of(connection, clock, default=None)  # a transport's own clock: the simulator's
        self.core = RelayCore(options=self.options, clock=clock, counters=counters)
        #: Parks deliveries to a missing exchange (or one the relay may not write) before a publish there
        #: would close the relay's channel; made on the first :meth:`attach` (see kombu_ladder.targets).
        self.exchange_check: Optional[ExchangeCheck] = None
        #: Seconds between two logs of the counters by :meth:`run` (None: only when it stops).
        self.report_every = report_every
        #: Set once the relay consumes from the control queue.
        self.ready = self.core.consuming
        self._started: Any = None
        self._later: Optional[Later] = None
        self._last_report = self._last_tick = time.monotonic()
        #: The stop signals that stop this relay (:meth:`run_until_signalled`); None: none.
        self.signals: Optional[StopSignals] = None

    @property
    def counters(self) -> Counters:
        """What the relay has done: received, delivered, hops, malformed, parked, refused, cancelled."""
        return self.core.counters

    @property
    def outstanding(self) -> int:
        """Publishes not yet confirmed by the broker."""
        return self.core.outstanding

    # -- on a connection someone else drives -------------------------------------------------

    def attach(self, connection: Any, channel: Any) -> RelayCore:
        """Declare the ladder on ``channel`` and return the consumer for it (not consuming yet).

        Raises:
            TopologyConflict: the broker's ladder conflicts with the contract.
        """
        declare(channel, queue_type=self.options.queue_type)
        if self.exchange_check is None:
            self.exchange_check = ExchangeCheck(connection.clone(), clock=link_for(channel).monotonic)
        self.exchange_check.forget()  # (re)connecting: an exchange may have gone meanwhile
        self.core.exchange_check = self.exchange_check
        return self.core.consumer(channel)

    def start(self, connection: Any, channel: Any) -> RelayCore:
        """:meth:`attach`, then consume: the relay takes expiries from now on, until :meth:`stop`."""
        consumer = self.attach(connection, channel)
        self._started = connection
        if self.connection is None:
            self.connection = connection
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
        if self.core.wakeup is None:  # a transport keeping time of its own set its timers already
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

        ``connection`` is the one whose frames carry the confirms (None: do not wait). The held
        messages are given up first (:meth:`RelayCore.stand_down`): requeued, or on a quorum control
        queue published back into a rung, whose confirms are waited for with the rest.
        """
        _quietly(self.core.stand_down, "giving up the held messages")
        self._pause_at("putting-back")
        deadline = time.monotonic() + grace
        while self.core.outstanding and connection is not None and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=0.1)
            except (socket.timeout, TimeoutError):
                continue
            except Exception:  # noqa: BLE001 - a dying connection: the broker requeues what is left
                break
        self.core.close()

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop taking expiries, wait up to ``grace`` seconds for the confirms of what was taken, and give
        held messages back to the broker.

        In :meth:`run`'s loop this asks the loop to end (within about a second; the loop waits for the
        confirms). Started otherwise, the relay stops here, where its frames are read.
        """
        self.should_stop = True
        connection, self._started = self._started, None
        if connection is None:
            return
        if self._later is not None:
            self._later = None
            self.core.wake_with(None)
        channel = self.core.channel
        _quietly(self.core.cancel, "cancelling the relay consumer")
        self.drain(connection, grace)
        if channel is not None:
            _quietly(channel.close, "closing the relay's channel")
        logger.info(I_STOPPED, self.counters.as_dict())

    def close(self) -> None:
        """Close the exchange check's connection (it reconnects if the relay starts again)."""
        if self.exchange_check is not None:
            self.exchange_check.close()

    # -- a loop of its own (kombu's ConsumerMixin) -------------------------------------------

    def run(self, _tokens: int = 1, **kwargs: Any) -> None:
        """Consume until :meth:`stop`, reconnecting as needed (kombu's ConsumerMixin loop)."""
        try:
            super().run(_tokens, **kwargs)
        except _Stopped:
            pass
        finally:
            self.close()

    def run_until_signalled(self, signals: Optional[StopSignals] = None) -> None:
        """Run until SIGTERM or SIGINT, then stop cleanly (main thread only). ``signals``: the handlers
        installed already, first thing at the start (:class:`StopSignals`); None: install them now."""
        (signals or StopSignals().install()).attach(self)
        self.run()
        logger.info(I_STOPPED, self.counters.as_dict())

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        """kombu's retry loop, connecting: give up when a stop was asked for (the broker may never come back)."""
        if self.should_stop:
            raise _Stopped()
        super().on_connection_error(exc, interval)

    def get_consumers(self, Consumer: Any, channel: Any) -> list[Any]:  # noqa: N803 - kombu's name
        consumer = self.attach(self.connection, channel)
        self._pause_at("connected")
        return [consumer]

    def _pause_at(self, phase: str) -> None:
        if self.signals is not None:
            signals = self.signals
            pause_at(phase, lambda: signals.received)

    def consume(self, limit: Optional[int] = None, timeout: Optional[float] = None, safety_interval: float = 1.0,
                **kwargs: Any) -> Iterator[None]:
        """kombu's ``ConsumerMixin.consume``, but each wait for frames ends when the earliest held message is
        due (:meth:`RelayCore.next_wakeup`), and due messages are published (:meth:`RelayCore.fire`) first."""
        core, elapsed = self.core, 0.0
        with self.consumer_context(**kwargs) as (conn, _channel, _consumers):
            read_in_bulk(getattr(conn, "connection", None))  # this loop reads while frames are buffered
            if not core.cancels.ready:  # the cancellations' marker is read by the drain_events below
                self._pause_at("catching-up")
            for _ in limit and range(limit) or count():
                if len(core.held):
                    self._pause_at("holding")
                if self.should_stop:
                    break
                self.on_iteration()
                if len(core.held):
                    core.fire()
                wait = core.next_wakeup()
                interval = safety_interval if wait is None else min(safety_interval, wait)
                try:
                    conn.drain_events(timeout=interval)
                except socket.timeout:
                    conn.heartbeat_check()
                    elapsed += interval
                    if timeout and elapsed >= timeout:
                        raise
                except OSError:
                    if not self.should_stop:
                        raise
                else:
                    yield
                    elapsed = 0.0

    def on_iteration(self) -> None:
        now = time.monotonic()
        if now - self._last_tick >= LOOP_TICK:
            self._last_tick = now
            self.tick()
        if self.report_every is not None and now - self._last_report >= self.report_every:
            self._last_report = now
            logger.info(I_COUNTERS, self.counters.as_dict())

    def on_consume_end(self, connection: Any, channel: Any) -> None:
        """Wait briefly for outstanding confirms, so a clean stop duplicates nothing."""
        self.drain(connection)
        logger.info(I_COUNTERS, self.counters.as_dict())


def _quietly(action: Callable[[], object], what: str) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - a lost connection: the broker requeues what was taken
        logger.debug("%s failed", what, exc_info=True)
