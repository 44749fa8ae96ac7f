"""SimulatedBroker: the in-memory RabbitMQ with a virtual clock, as tests and demos use it."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from datetime import datetime
from typing import Any, NamedTuple, Optional, Union

from amqp.basic_message import Message as AmqpMessage
from kombu import Connection
from kombu.transport import pyamqp

from .client_codec import client_body, copy_decoded
from .clock import VirtualClock
from .core import BrokerCore
from .frames import Call
from .permissions import Permissions
from .profiles import DEFAULT, profile_for
from .registry import SCHEME, named, register, unique_name

__all__ = ["SimulatedBroker", "Arrival", "SimulatorStalled"]

logger = logging.getLogger(__name__)


class SimulatorStalled(RuntimeError):
    """A consumer thread did not handle what was delivered to it in time."""


class Arrival(NamedTuple):
    """A message as it reached a queue, and when (virtual time)."""

    #: Virtual epoch seconds of the arrival.
    at: float
    #: The message as a consumer would have read it (a kombu Message without a channel).
    message: Any


class SimulatedBroker(BrokerCore):
    """An in-memory RabbitMQ (classic queues) behind a real kombu transport, on a virtual clock.

    Arguments:
        start: the virtual time to start at (epoch seconds or an aware
            datetime); the default is now, rounded down to the second.
        name: the broker's name in its ``ladder-sim://localhost/<name>`` URL.
        record: keep every arrival for :meth:`arrivals`.
        settle_timeout: real seconds :meth:`advance` waits for consumer threads.
        expiry_lag: seconds a message expires after its TTL. The default, 0,
            is an ideal broker: a delay takes exactly the hops
            :func:`~kombu_ladder.plan.hops_for` forecasts. RabbitMQ expires a
            few milliseconds late (2.5 ms median on a quiet broker), so the
            remaining time after each hop falls just short of the next rung
            and the ladder takes smaller rungs; ``expiry_lag=0.002``
            reproduces RabbitMQ's hop counts.
        rabbitmq: the RabbitMQ release to behave as: ``"3.10"`` (the default) or
            ``"4.3"``, which refuses ``x-queue-mode``, ``x-queue-version=1`` and
            transient non-exclusive queues, and applies ``basic.qos(global=true)``
            per consumer (see :mod:`kombu_ladder.simulator.profiles`).
    """

    def __init__(self, *, start: Optional[Union[float, datetime]] = None, name: Optional[str] = None,
                 record: bool = True, settle_timeout: float = 10.0, expiry_lag: float = 0.0,
                 rabbitmq: str = DEFAULT) -> None:
        super().__init__(VirtualClock(start), record=record,
                         expiry_lag=VirtualClock.to_ms(expiry_lag, argument="expiry_lag"))
        self.profile = profile_for(rabbitmq)
        self.permissions = Permissions(self.vhost, names_rights=self.profile.names_rights)
        self.name = name or unique_name()
        self.settle_timeout = settle_timeout
        self._driven: list[Any] = []
        self._ticks: list[Any] = []
        #: Relays' timers in virtual time: (epoch ms, order, transport, function); see call_later.
        self._timers: list[tuple[int, int, Any, Any]] = []
        self._timer_order = itertools.count()
        #: The relays :meth:`host` runs.
        self.relays: list[Any] = []
        register(self.name, self)

    @classmethod
    def named(cls, name: str) -> "SimulatedBroker":
        """Return the broker of this process called ``name``; the first call makes it (with defaults).

        ``Connection("ladder-sim://<name>")`` calls this, so a URL alone (in a Celery
        settings file, say) reaches the same broker as the test that asks for it by name.
        """
        return named(name, lambda n: cls(name=n))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<SimulatedBroker {self.name} at {self.clock.datetime().isoformat()}>"

    # -- connecting -----------------------------------------------------------

    @property
    def url(self) -> str:
        """The broker URL (for kombu ``Connection`` or Celery's ``broker_url``)."""
        return f"{SCHEME}://localhost/{self.name}"

    def connection(self, **kwargs: Any) -> Connection:
        """Return a new kombu Connection to this broker (``kwargs`` go to Connection)."""
        return Connection(self.url, **kwargs)

    def drive(self, connection: Connection, *, tick: Optional[Any] = None) -> None:
        """Have :meth:`advance` and :meth:`settle` handle ``connection``'s deliveries in the calling thread.

        For consumers nobody drains: :meth:`host` uses it for what it runs. ``tick``
        is called on every settle, as a real relay's loop calls it about once a second.
        """
        transport = connection.connection  # establishes the connection when needed
        transport.driven = True
        self._driven.append(transport)
        if tick is not None:
            self._ticks.append(tick)

    def host(self, relay: Any) -> Any:
        """Run ``relay`` on a connection of its own that :meth:`advance` drives in the calling thread; return it.

        ``relay`` is what a worker's event loop would run: ``start(connection, channel)``,
        ``tick()`` and ``close()`` (the ladder's :class:`kombu_ladder.Relay`). Every
        :meth:`advance` (or :meth:`settle`) hands it what reached it, and it republishes
        before the clock moves on; it keeps time with this broker's virtual clock.
        :meth:`close` stops it (unacked expiries go back to their queue).
        """
        connection = self.connection()
        relay.start(connection, connection.channel())
        self.drive(connection, tick=relay.tick)
        self.relays.append(relay)
        self.settle()
        return relay

    def set_permissions(self, *, configure: str = ".*", write: str = ".*", read: str = ".*") -> None:
        """Give the simulated user these permission regexps, as ``rabbitmqctl set_permissions`` does."""
        with self.lock:
            self.permissions = Permissions(self.vhost, configure, write, read, names_rights=self.profile.names_rights)

    def close(self) -> None:
        """Stop what :meth:`host` runs and close every connection to it."""
        for relay in self.relays:
            relay.close()
        with self.lock:
            connections = list(self.connections)
        for transport in connections:
            transport.client.release()

    # -- the clock --------------------------------------------------------------

    def now(self) -> float:
        """Return the virtual time in epoch seconds (pass as ``clock=``)."""
        return self.clock.now()

    @property
    def now_ms(self) -> int:
        """The virtual time in epoch milliseconds."""
        return self.clock.ms

    def datetime(self) -> datetime:
        """Return the virtual time as an aware UTC datetime."""
        return self.clock.datetime()

    def next_expiry(self) -> Optional[float]:
        """Return when the next message expires (virtual epoch seconds), or None."""
        with self.lock:
            due = self._next_due()
        return None if due is None else due / 1000

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds``, processing everything due on the way.

        Expiries happen in due order; each dead-lettered message is routed,
        and every consumer that is being drained (a relay :meth:`host` runs, or a
        ``Scheduler``'s relay thread) handles what reached it before the clock
        moves on. ``advance(0)`` just lets consumers catch up.
        """
        target = self.clock.ms + VirtualClock.to_ms(seconds)
        self.settle()
        while True:
            with self.lock:
                due = self._next_due()
                last = due is None or due > target
                self.clock.move_to(target if last or due is None else due)
                self._expire_due()
            self.settle()
            if last:
                return

    def call_later(self, transport: Any, seconds: float, function: Any) -> None:
        """Run ``function`` on ``transport`` (where it is drained) ``seconds`` of virtual time from now."""
        at = self.clock.ms + max(0, math.ceil(seconds * 1000 - 0.01))
        with self.lock:
            heapq.heappush(self._timers, (at, next(self._timer_order), transport, function))

    def _next_due(self) -> Optional[int]:
        heads = [q.ready[0].expires_at for q in self.queues.values() if q.ready]
        due = [t for t in heads if t is not None]
        if self._timers:
            due.append(self._timers[0][0])
        return min(due) if due else None

    def _expire_due(self) -> None:
        now = self.clock.ms
        while self._timers and self._timers[0][0] <= now:
            _, _, transport, function = heapq.heappop(self._timers)
            if not transport.closed:
                transport.post(Call(function))
        for queue in list(self.queues.values()):
            if queue.ready and queue.ready[0].expires_at is not None and queue.ready[0].expires_at <= now:
                self.dispatch(queue)

    def settle(self) -> None:
        """Let every consumer handle what has been delivered to it, until nothing moves.

        Driven connections (:meth:`drive`) are processed in this thread; for
        consumers on other threads it waits, up to ``settle_timeout`` real seconds.

        Raises:
            SimulatorStalled: a consumer thread kept messages waiting too long.
        """
        deadline = time.monotonic() + self.settle_timeout
        me = threading.current_thread()
        for tick in self._ticks:
            tick()
        while True:
            handled = sum(t.process() for t in self._driven if not t.closed)
            with self.cond:
                waiting = [t for t in self.connections if not t.driven and not t.closed
                           and (t.inbox or t.busy or t.unconfirmed)
                           and t.driver is not None and t.driver is not me and t.driver.is_alive()]
                if not waiting:
                    if not handled and not any(t.inbox or t.unconfirmed for t in self._driven if not t.closed):
                        return
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SimulatorStalled(
                        f"consumer thread(s) {sorted(t.driver.name for t in waiting)} did not handle their "
                        f"deliveries within {self.settle_timeout:g}s of real time")
                self.cond.wait(min(remaining, 0.05))

    # -- looking inside ---------------------------------------------------------

    def queue_names(self) -> list[str]:
        """Return the declared queues' names, sorted."""
        with self.lock:
            return sorted(self.queues)

    def queue_arguments(self, queue: str) -> Optional[dict[str, Any]]:
        """Return ``queue``'s arguments as this release reports them (``rabbitmqctl list_queues
        arguments``), or None when it does not exist."""
        with self.lock:
            found = self.queues.get(queue)
            return None if found is None else self.profile.read_back(dict(found.arguments))

    def depth(self, queue: str) -> int:
        """Return how many messages are ready in ``queue`` (0 when it does not exist)."""
        with self.lock:
            found = self.queues.get(queue)
            return len(found.ready) if found else 0

    def messages(self, queue: str) -> list[Any]:
        """Return the messages ready in ``queue``, head first, without taking them."""
        with self.lock:
            found = self.queues.get(queue)
            return [_snapshot(m) for m in (found.ready if found else ())]

    def take(self, queue: str, limit: Optional[int] = None) -> list[Any]:
        """Remove and return up to ``limit`` (default: all) ready messages from ``queue``, head first."""
        with self.lock:
            found = self.queues.get(queue)
            out: list[Any] = []
            while found is not None and found.ready and (limit is None or len(out) < limit):
                out.append(_snapshot(found.ready.popleft()))
            return out

    def arrivals(self, queue: str) -> list[Arrival]:
        """Return every message that reached ``queue`` so far, with its virtual arrival time."""
        with self.lock:
            return [Arrival(ms / 1000, _snapshot(m)) for ms, m in self._arrivals.get(queue, ())]


def _snapshot(stored: Any) -> Any:
    properties = copy_decoded(stored.properties)
    raw = AmqpMessage(client_body(stored.body, properties), **properties)
    raw.delivery_info = {"delivery_tag": None, "redelivered": stored.redelivered,
                         "exchange": stored.exchange, "routing_key": stored.routing_key}
    return pyamqp.Message(raw, channel=None)
