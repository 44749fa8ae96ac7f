"""``kombu-ladder declare|relay|status|replay|move``: operate the ladder from a shell."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Optional, Sequence

from kombu import Connection
from kombu.exceptions import OperationalError

from .contract import CONTROL, PARKING, rung_names
from .migrate import move
from .parking import parked_reasons, replay
from .relay import Relay
from .topology import declare

__all__ = ["main", "queue_depths", "DEFAULT_BROKER"]

logger = logging.getLogger(__name__)

#: The broker used when neither ``--broker`` nor ``$KOMBU_LADDER_BROKER`` is given.
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


def queue_depths(connection: Any) -> list[tuple[str, Optional[int], Optional[int]]]:
    """Return ``(queue, messages, consumers)`` for every rung, the control and parking queues.

    A queue that does not exist is reported with ``None`` counts.
    """
    rows = []
    for name in [*rung_names(), CONTROL, PARKING]:
        channel = connection.channel()
        try:
            _, messages, consumers = channel.queue_declare(name, passive=True)
            rows.append((name, messages, consumers))
        except connection.channel_errors:
            rows.append((name, None, None))
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - the broker closed it on a missing queue
                pass
    return rows


def _status(connection: Any, args: argparse.Namespace) -> int:
    print(f"{'queue':<26} {'messages':>9} {'consumers':>9}")
    parked = 0
    for name, messages, consumers in queue_depths(connection):
        if messages is None:
            print(f"{name:<26} {'missing':>9} {'-':>9}")
        else:
            print(f"{name:<26} {messages:>9} {consumers:>9}")
            if name == PARKING:
                parked = messages
    if parked and args.parked:
        print(f"\nwhy they are parked (the first {min(parked, args.parked)}):")
        for reason, count in parked_reasons(connection, limit=args.parked):
            print(f"{count:>7}  {reason}")
    return 0


def _replay(connection: Any, args: argparse.Namespace) -> int:
    declare(connection)
    result = replay(connection, limit=args.limit, match=args.match)
    print(f"replayed {result.replayed} parked message(s) to {CONTROL}; {result.kept} left parked")
    return 0


def _move(connection: Any, args: argparse.Namespace) -> int:
    with Connection(args.to, connect_timeout=5) as target:
        try:
            target.ensure_connection(max_retries=1)
        except (OperationalError, *target.connection_errors) as exc:
            print(f"kombu-ladder: cannot reach the target broker at {target.as_uri()}: {exc}", file=sys.stderr)
            return 2
        result = move(connection, target, limit=args.limit, include_parked=not args.keep_parked)
    for name, count in result.moved.items():
        print(f"{name:<26} {count:>9}")
    print(f"moved {result.total} message(s)")
    return 0


def _declare(connection: Any) -> int:
    for name in declare(connection):
        print(name)
    return 0


def _relay(connection: Any, args: argparse.Namespace) -> int:
    relay = Relay(
        connection,
        prefetch=args.prefetch,
        allowed_exchanges=args.allow_exchange or None,
        report_every=args.report_every,
    )
    relay.run_until_signalled()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``kombu-ladder``."""
    parser = argparse.ArgumentParser(prog="kombu-ladder", description=__doc__)
    parser.add_argument(
        "--broker", default=os.environ.get("KOMBU_LADDER_BROKER", DEFAULT_BROKER),
        help="broker URL (default: $KOMBU_LADDER_BROKER or %(default)s)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("declare", help="declare the exchange, the rungs and the control queue")
    status = sub.add_parser("status", help="show each rung's depth and consumers, and the control and parking queues")
    status.add_argument("--parked", type=int, default=100, metavar="N",
                        help="tally the reasons of the first N parked messages (default: %(default)s; 0: none)")
    replay_ = sub.add_parser("replay", help="send parked messages back through the relay once their route is fixed")
    replay_.add_argument("--limit", type=int, default=None, metavar="N", help="replay at most N messages")
    replay_.add_argument("--match", default=None, metavar="TEXT",
                         help="replay only messages whose x-ladder-parked-reason contains TEXT")
    move_ = sub.add_parser("move", help="move the waiting ladder to another broker (blue-green); see the docs")
    move_.add_argument("--to", required=True, metavar="URL", help="the broker to fill (--broker is emptied)")
    move_.add_argument("--limit", type=int, default=None, metavar="N", help="move at most N messages per queue")
    move_.add_argument("--keep-parked", action="store_true", help="leave acemq.schedule.parked where it is")
    relay = sub.add_parser("relay", help="run a relay until SIGTERM or SIGINT")
    relay.add_argument("--prefetch", type=int, default=50, help="expired messages held at once (default: 50)")
    relay.add_argument("--report-every", type=float, default=30.0, metavar="SECONDS",
                       help="log the counters this often (default: 30)")
    relay.add_argument("--allow-exchange", action="append", metavar="NAME",
                       help="only deliver to this target exchange (repeatable; '' is the default exchange)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Connection(args.broker, connect_timeout=5) as connection:
        try:
            connection.ensure_connection(max_retries=1)
        except (OperationalError, *connection.connection_errors) as exc:  # kombu wraps socket errors
            print(f"kombu-ladder: cannot reach the broker at {connection.as_uri()}: {exc}", file=sys.stderr)
            return 2
        if args.command == "declare":
            return _declare(connection)
        if args.command == "status":
            return _status(connection, args)
        if args.command == "replay":
            return _replay(connection, args)
        if args.command == "move":
            return _move(connection, args)
        return _relay(connection, args)
