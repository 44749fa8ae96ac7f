"""``make demo``: schedule mixed delays, longest first, and watch the short ones overtake.

A scenario to run from a clone (``make demo``, or ``python examples/demo.py``), not
part of the installed package: it shows the library, as the other examples do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence

from kombu import Connection, Consumer, Queue
from kombu.exceptions import OperationalError

from kombu_ladder import Scheduler
from kombu_ladder.brokers import DEFAULT_BROKER
from kombu_ladder.contract import describe
from kombu_ladder.plan import HOLD_WINDOW, forecast

__all__ = ["main", "DELAYS", "Row", "run_scenario"]

#: The scenario's delays in seconds, published in this order (longest first).
DELAYS: tuple[float, ...] = (65, 12, 5, 2)

#: The queue the demo's messages are finally delivered to.
DEMO_QUEUE = "ladder.demo"

#: The environment variable naming the demo's broker (``make demo``).
BROKER_ENV = "LADDER_DEMO_BROKER"

E_REFUSED = ("the broker at {url} answered but refused the demo: {reason}\n"
             "Fix the URL (--broker, or ${env}) or the broker's user; the demo runs on the simulator only when "
             "no broker listens there.")


class Row:
    """One delivered message as the table shows it."""

    def __init__(self, delay: float, due: float, arrived: float) -> None:
        self.delay, self.due, self.arrived = delay, due, arrived

    @property
    def rungs(self) -> tuple[int, ...]:
        """The rungs the message waits in, allowing each expiry a millisecond of latency (then the relay holds it)."""
        return forecast(round(self.delay * 1000), lag_ms=1, hold_window_ms=round(HOLD_WINDOW * 1000))[0]

    @property
    def lateness(self) -> float:
        """Arrival minus due time, in seconds (negative means early)."""
        return self.arrived - self.due


def _clock_text(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


HEADER = f"{'order':>5}  {'delay':>6}  {'due (UTC)':>12}  {'arrived (UTC)':>13}  {'lateness':>9}  rungs waited in"


def _print_row(index: int, row: Row) -> None:
    print(
        f"{index:>5}  {describe(row.delay) if row.delay >= 1 else row.delay:>6}  {_clock_text(row.due):>12}  "
        f"{_clock_text(row.arrived):>13}  {row.lateness * 1000:>+7.0f}ms  {' '.join(describe(r) for r in row.rungs)}",
        flush=True,
    )


def run_scenario(
    connection: Connection,
    *,
    clock: Callable[[], float],
    pump: Callable[[], None],
    delays: Sequence[float] = DELAYS,
    timeout: float = 120.0,
) -> tuple[list[Row], Scheduler]:
    """Schedule ``delays`` (in the order given) and collect the arrivals.

    Arguments:
        connection: where to schedule and consume.
        clock: epoch seconds (real, or a simulator's virtual clock).
        pump: called repeatedly while waiting; it lets time pass (drain events,
            or advance a virtual clock).
        delays: seconds, published in this order.
        timeout: give up waiting after this many seconds of ``clock`` time.

    Returns:
        The rows in arrival order, and the (closed) scheduler for its counters.
    """
    channel = connection.channel()
    # Exclusive: RabbitMQ 4.3 refuses a transient queue that is not (deprecated feature
    # transient_nonexcl_queues), and the demo's queue should vanish with the demo anyway.
    queue = Queue(DEMO_QUEUE, exchange="", routing_key=DEMO_QUEUE, durable=False, exclusive=True)
    queue(channel).declare()
    queue(channel).purge()
    rows: list[Row] = []

    def on_message(body: Any, message: Any) -> None:
        arrived = clock()
        row = Row(float(body["delay"]), float(body["due"]), arrived)
        rows.append(row)
        _print_row(len(rows), row)
        message.ack()

    scheduler = Scheduler.on(connection, clock=clock)
    try:
        with Consumer(channel, [queue], callbacks=[on_message], accept=["json"]):
            start = clock()
            for delay in delays:
                # One due time per message, fixed before the first publish: the lateness column then
                # measures the ladder, not how long the publishes before it took.
                due = start + delay
                scheduler.at(datetime.fromtimestamp(due, timezone.utc), {"delay": delay, "due": due},
                             routing_key=DEMO_QUEUE)
                print(f"scheduled a {describe(delay)} message, due {_clock_text(start + delay)}", flush=True)
            print("\n" + HEADER, flush=True)
            while len(rows) < len(delays) and clock() - start < timeout:
                pump()
    finally:
        scheduler.close()
    return rows, scheduler


def _summary(rows: list[Row], scheduler: Scheduler, delays: Sequence[float]) -> int:
    order = [row.delay for row in rows]
    arrived = ", ".join(describe(d) for d in order)
    print(f"\narrival order: {arrived} (published {', '.join(describe(d) for d in delays)})")
    print(f"{scheduler}; the relay moved messages between rungs {scheduler.hops} times")
    print("The relay holds each message's last seconds (its hold window) and delivers it at its due time;"
          "\nan AceMQ relay of another language delivers up to the smallest rung (1 s) early.")
    if len(rows) < len(delays):
        print(f"only {len(rows)} of {len(delays)} messages arrived", file=sys.stderr)
        return 1
    if order != sorted(delays):
        print("messages arrived out of due order", file=sys.stderr)
        return 1
    print("the short messages overtook the long ones: no head-of-line blocking.")
    return 0


def _drain(connection: Connection) -> Callable[[], None]:
    def pump() -> None:
        try:
            connection.drain_events(timeout=0.2)
        except TimeoutError:
            pass
        except OSError as exc:  # socket.timeout is an OSError on 3.9
            if "timed out" not in str(exc):
                raise
    return pump


def _run_on_rabbitmq(url: str) -> int:
    print(f"RabbitMQ at {url}: scheduling {len(DELAYS)} messages with a real relay\n")
    with Connection(url) as connection:
        rows, scheduler = run_scenario(connection, clock=time.time, pump=_drain(connection))
    return _summary(rows, scheduler, DELAYS)


def _run_on_simulator() -> Optional[int]:
    try:
        from kombu_ladder.simulator import SimulatedBroker
    except ImportError:
        return None
    # Expiries a couple of milliseconds late, as on RabbitMQ, so the run hops and arrives as it would there.
    broker = SimulatedBroker(expiry_lag=0.002)
    print("running the same scenario on the in-memory simulator (virtual clock: no waiting)\n")
    with broker.connection() as connection:
        broker.drive(connection)  # advance() hands this connection's deliveries to the demo's consumer
        rows, scheduler = run_scenario(
            connection, clock=broker.now, pump=lambda: broker.advance(0.1),
            timeout=max(DELAYS) + 30,
        )
    return _summary(rows, scheduler, DELAYS)


def _absent(url: str) -> Optional[str]:
    """None when a broker answers at ``url``; why not when nothing does (refused, no such host, timeout).

    A broker that answers and refuses (a wrong password, a missing vhost) raises: the demo
    stops with that error rather than hide it behind the simulator.
    """
    try:
        with Connection(url, connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1)
        return None
    except (OperationalError, OSError) as exc:  # kombu wraps "nothing listens there" in OperationalError
        return str(exc) or type(exc).__name__


def _masked(url: str) -> str:
    """``url`` with its password masked, as kombu shows it."""
    try:
        return Connection(url).as_uri()
    except Exception:  # noqa: BLE001 - a URL kombu cannot read is shown as given
        return url


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo; return the exit status."""
    parser = argparse.ArgumentParser(prog="python examples/demo.py", description=__doc__)
    parser.add_argument("--broker", default=os.environ.get(BROKER_ENV, DEFAULT_BROKER),
                        help=f"RabbitMQ URL [default: ${BROKER_ENV}, else {DEFAULT_BROKER}]")
    parser.add_argument("--simulator", action="store_true", help="use the in-memory simulator even if a broker is up")
    args = parser.parse_args(argv)
    try:
        problem = "--simulator was given" if args.simulator else _absent(args.broker)
    except Exception as exc:  # noqa: BLE001 - a broker that refused us, or a URL kombu cannot read: say which
        print(E_REFUSED.format(url=_masked(args.broker), reason=" ".join(str(exc).split()) or type(exc).__name__,
                               env=BROKER_ENV), file=sys.stderr)
        return 2
    if problem is None:
        return _run_on_rabbitmq(args.broker)
    print(f"no RabbitMQ at {args.broker} ({problem}).")
    status = _run_on_simulator()
    if status is None:
        print("The simulator is not available either. Start RabbitMQ with:\n"
              "    rabbitmq-server -detached && rabbitmqctl await_startup\n"
              "then run `make demo` again.", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    raise SystemExit(main())
