"""The kombu transport for ``ladder-sim://`` URLs: one per connection, with its inbox of frames."""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import amqp
from amqp.exceptions import RecoverableConnectionError
from kombu.transport import virtual

from ..link import Guard
from .channel import Channel
from .frames import Confirm
from .link import SimulatedLink
from .registry import SCHEME, name_in

__all__ = ["Transport", "Channel", "SCHEME"]


class Transport(virtual.Transport):
    """kombu transport for ``ladder-sim://<broker name>`` (or ``ladder-sim://localhost/<name>``) URLs.

    A name no broker of this process has yet makes one (see :meth:`SimulatedBroker.named`).
    """

    Channel = Channel

    driver_type = "amqp"
    driver_name = "ladder-simulator"
    connection_errors = amqp.Connection.connection_errors
    channel_errors = amqp.Connection.channel_errors
    recoverable_connection_errors = amqp.Connection.recoverable_connection_errors
    recoverable_channel_errors = amqp.Connection.recoverable_channel_errors
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic", "fanout", "headers"]), heartbeats=False,
    )

    #: The most real time one ``drain_events`` call waits for something to arrive.
    #: Virtual time only moves with ``advance()``, so waiting longer would only stall.
    max_block = 0.05

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        from .broker import SimulatedBroker  # the broker module imports this one's package, not this one

        self.broker = SimulatedBroker.named(name_in(client.hostname, client.virtual_host))
        #: Frames the broker has sent this connection: deliveries, confirms, returns.
        self.inbox: "deque[Any]" = deque()
        self.busy = 0
        #: The thread that consumes on this connection (the one that drains it).
        self.driver: Optional[threading.Thread] = None
        #: Drained by the broker itself during advance() (see SimulatedBroker.drive).
        self.driven = False
        self.closed = True
        #: The largest frame, as RabbitMQ negotiates it by default (a content header is one frame).
        self.frame_max = 131072
        #: What stands between this connection's frames and its channels, as on a relay's py-amqp
        #: connection (see :class:`kombu_ladder.link.Guard`): it passes every frame of a channel it
        #: does not watch untouched.
        self.guard = Guard()
        self._link: Optional[SimulatedLink] = None

    def ladder_link(self) -> SimulatedLink:
        """This connection's :class:`~kombu_ladder.link.Link` (see :func:`kombu_ladder.link.link_for`):
        the broker's virtual clock and timers; what a producer, scheduler or relay here keeps time with."""
        if self._link is None:
            self._link = SimulatedLink(self)
        return self._link

    def establish_connection(self) -> "Transport":
        with self.broker.lock:
            self.closed = False
            self.broker.connections.add(self)
        return self

    def create_channel(self, connection: Any) -> Any:
        channel = self.Channel(connection)
        self.channels.append(channel)
        return channel

    def close_connection(self, connection: Any) -> None:
        with self.broker.lock:
            channels = list(self.channels)
            self.broker.close_connection(self, channels)
            for channel in channels:
                channel.close()
            self.closed = True
            self.inbox.clear()

    def verify_connection(self, connection: Any) -> bool:
        return not self.closed

    @property
    def unconfirmed(self) -> bool:
        """Whether a channel of this connection waits for confirms of routed publishes."""
        return any(getattr(c, "deferred", None) for c in self.channels)

    def claim(self) -> None:
        """Record the calling thread as the one that consumes on this connection."""
        self.driver = threading.current_thread()

    def post(self, event: Any) -> None:
        """Queue a frame for this connection (called with the broker lock held)."""
        inbox = self.inbox
        if isinstance(event, Confirm) and inbox:
            last = inbox[-1]
            if (isinstance(last, Confirm) and last.channel is event.channel and last.ack == event.ack
                    and last.generation == event.generation and last.seq == event.seq - 1):
                last.seq, last.multiple = event.seq, True  # RabbitMQ batches confirms the same way
                return
        inbox.append(event)
        self.broker.cond.notify_all()

    def drain_events(self, connection: Any, timeout: Optional[float] = None, **_: Any) -> None:
        cond = self.broker.cond
        block = self.max_block if timeout is None else max(0.0, min(timeout, self.max_block))
        deadline = time.monotonic() + block
        with cond:
            self.claim()
            self.broker.flush_confirms(self)
            while not self.inbox:
                if self.closed:
                    raise RecoverableConnectionError("connection already closed")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout()
                cond.wait(remaining)
        self.process()

    def process(self) -> int:
        """Handle every frame waiting for this connection; return how many."""
        return self.process_until(lambda: False)

    def process_until(self, done: Callable[[], bool]) -> int:
        """Handle frames, in order, until ``done()`` or none is left; return how many."""
        cond = self.broker.cond
        handled = 0
        with cond:
            self.busy += 1
        try:
            while not done():
                with cond:
                    if not self.inbox:
                        self.broker.flush_confirms(self)  # the queues have taken what was routed
                    if not self.inbox:
                        break
                    event = self.inbox.popleft()
                event.fire()
                handled += 1
        finally:
            with cond:
                self.busy -= 1
                cond.notify_all()
        return handled

    @property
    def default_connection_params(self) -> dict[str, Any]:
        return {"hostname": "localhost", "port": None}
