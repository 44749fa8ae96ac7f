"""Broker backends for the behaviour tests: the same test bodies run on RabbitMQ and on the simulator."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import pytest
from helpers import broker_release, wait_for
from helpers import queue_depth as depth
from kombu import Connection, Exchange, Queue

#: ``depth`` is helpers.queue_depth, named as the behaviour tests use it.
__all__ = ["RabbitBackend", "SimulatorBackend", "Arrivals", "get", "depth", "declare_target"]


class RabbitBackend:
    """A real RabbitMQ vhost, real time.

    The interface every backend provides: ``name``, :meth:`connection`,
    :attr:`clock` (epoch seconds) and :meth:`wait_until`.
    """

    #: The ``ladder_backend`` parameter this backend answers to.
    name = "rabbitmq"

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def release(self) -> tuple[int, ...]:
        """The broker's RabbitMQ release, as (major, minor, patch)."""
        return broker_release()

    #: The clock the ladder runs on (epoch seconds); also what tests measure arrivals with.
    clock: Callable[[], float] = staticmethod(time.time)

    def connection(self) -> Connection:
        """Return a new kombu Connection to this backend's broker (use it as a context manager)."""
        return Connection(self.url)

    def wait_until(self, condition: Callable[[], Any], timeout: float = 30.0,
                   message: str = "condition", interval: float = 0.02) -> Any:
        """Poll ``condition`` until it is truthy and return its value; fail after ``timeout`` seconds."""
        return wait_for(condition, timeout, interval=interval, message=message)


class SimulatorBackend:
    """The in-memory simulator on a virtual clock: the same interface as :class:`RabbitBackend`.

    :meth:`wait_until` moves the virtual clock from one event (expiry or timer)
    to the next, or in small steps when none is pending, until the condition
    holds; nothing sleeps. Messages
    expire 2 ms late, as on RabbitMQ, so hop counts come out as they do there.
    """

    #: How late a message expires (seconds): RabbitMQ's median on a quiet broker, rounded down.
    expiry_lag = 0.002

    name = "simulator"

    def __init__(self, broker: Optional[Any] = None, *, rabbitmq: str = "3.10") -> None:
        from kombu_ladder.simulator import SimulatedBroker

        self.broker = broker if broker is not None else SimulatedBroker(expiry_lag=self.expiry_lag,
                                                                         rabbitmq=rabbitmq)
        #: The virtual clock (epoch seconds).
        self.clock: Callable[[], float] = self.broker.now

    @property
    def release(self) -> tuple[int, ...]:
        """The RabbitMQ release the simulator behaves as (its profile), as (major, minor)."""
        return tuple(int(part) for part in self.broker.profile.name.split("."))

    def connection(self) -> Connection:
        """Return a new kombu Connection to the simulated broker."""
        return self.broker.connection()

    def wait_until(self, condition: Callable[[], Any], timeout: float = 30.0,
                   message: str = "condition", interval: float = 0.02) -> Any:
        """Advance virtual time until ``condition`` is truthy; fail after ``timeout`` virtual seconds."""
        broker = self.broker
        deadline = broker.now_ms + round(timeout * 1000)
        step = max(1, round(interval * 1000))
        while True:
            broker.advance(0)
            value = condition()
            if value:
                return value
            now = broker.now_ms
            if now >= deadline:
                pytest.fail(f"timed out after {timeout:g}s (virtual) waiting for {message}")
            # Nothing changes between two events (an expiry, or a timer such as the relay's hold alarm):
            # jump to the next one, which is exact and costs one step however far it is; with none
            # pending, creep forward ``interval`` at a time for whatever a thread is about to do.
            expiry = broker.next_expiry()
            if expiry is None:
                until = min(deadline, now + step)
            else:
                until = max(now + 1, min(deadline, round(expiry * 1000)))
            broker.advance((until - now) / 1000)

    def close(self) -> None:
        """Close every connection to the simulated broker."""
        self.broker.close()


def get(conn: Connection, queue: str, *, no_ack: bool = True) -> Optional[Any]:
    """Return one message from ``queue`` (a kombu Message) or None, without declaring anything."""
    return Queue(queue, no_declare=True).bind(conn.default_channel).get(no_ack=no_ack, accept=None)


def declare_target(conn: Connection, queue: str, *, exchange: str = "", routing_key: Optional[str] = None) -> Queue:
    """Declare (and empty) a target queue, bound to ``exchange`` when one is named."""
    if exchange:
        q = Queue(queue, Exchange(exchange, type="direct", durable=True), routing_key=routing_key or queue,
                  durable=True)
    else:
        q = Queue(queue, durable=True)
    bound = q.bind(conn.default_channel)
    bound.declare()
    bound.purge()
    return bound


class Arrivals:
    """Collect messages from target queues, stamping each with the backend's clock when it is seen."""

    def __init__(self, backend: Any, conn: Connection, *queues: str) -> None:
        self.backend = backend
        self.conn = conn
        self.queues = queues
        #: (queue, arrival time in epoch seconds, kombu Message), in arrival order.
        self.seen: list[tuple[str, float, Any]] = []

    def poll(self) -> int:
        """Take whatever is waiting in the queues; return how many have arrived so far."""
        for queue in self.queues:
            while True:
                message = get(self.conn, queue)
                if message is None:
                    break
                self.seen.append((queue, self.backend.clock(), message))
        return len(self.seen)

    def wait(self, count: int, timeout: float = 30.0) -> list[tuple[str, float, Any]]:
        """Wait until ``count`` messages have arrived; return them."""
        self.backend.wait_until(lambda: self.poll() >= count, timeout,
                                message=f"{count} message(s) on {', '.join(self.queues)}")
        return self.seen

    @property
    def messages(self) -> list[Any]:
        """The arrived messages, in order."""
        return [m for _, _, m in self.seen]
