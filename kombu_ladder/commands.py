"""The ladder's commands, written once: ``kombu-ladder`` and ``celery ladder`` both run these bodies.

Each body takes a connected :class:`kombu.Connection` and writes its output with
:func:`emit`. :func:`open_connection` and :func:`connected` turn every broker
error into one line and an exit status, so no command prints a traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Optional, Sequence

import click
from kombu import Connection
from kombu.exceptions import OperationalError

from .brokers import UnsupportedBroker, require_rabbitmq
from .cancelling import cancel_many
from .cancels import STREAM
from .contract import CONTROL, PARKING, PREFETCH
from .depths import QueueDepth, queue_depths
from .due import DueBound, due_bounds, due_lines
from .errors import LadderError
from .migrate import move as move_ladder
from .parking import parked_reasons
from .parking import replay as replay_parked
from .plan import MAX_DELAY
from .relay import Relay
from .timing import HOLD_WINDOW
from .topology import declare as declare_topology

__all__ = [
    "CommandError", "BrokerUnavailable", "BadUsage",
    "open_connection", "check_broker_url", "connected", "emit", "configure_logging",
    "declare", "status_report", "status_lines", "status", "cancel", "replay", "move", "relay", "metrics_server",
]

#: Exit status when the broker cannot be reached (sysexits' EX_UNAVAILABLE, as Celery's commands use).
EX_UNAVAILABLE = 69

#: Exit status of a usage error: a bad option value, an unsupported broker URL.
EX_USAGE = 2

#: Connection timeout, in seconds, of the commands' connections.
CONNECT_TIMEOUT = 5.0

E_CONNECT = ("Could not connect to the message broker at {url}. Please make sure RabbitMQ is running and the "
             "connection settings are correct. Reason: {reason}")
E_BAD_URL = "invalid broker URL {url!r}: {reason}"
E_REFUSED = "the broker at {url} refused an operation: {reason}"
E_LOST = "lost the connection to the broker at {url}: {reason}"
I_STATUS_HEADER = "{:<26} {:>9} {:>9}"
I_PARKED_TITLE = "why they are parked (the first {}):"
I_REPLAYED = "replayed {} parked message(s) to {}; {} left parked"
I_MOVED = "moved {} message(s)"
I_CANCELLED = "cancelled {} message(s): recorded in {}; every relay drops them at their next hop or delivery"

#: Log format of the commands that log (the relay).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class CommandError(click.ClickException):
    """A command failed for a reason the user can fix: shown as one ``Error:`` line, exit status 1."""


class BrokerUnavailable(CommandError):
    """The broker cannot be reached, refused the login, or went away: exit status 69."""

    exit_code = EX_UNAVAILABLE


class BadUsage(CommandError):
    """An option value the ladder cannot work with, such as a Redis URL: exit status 2."""

    exit_code = EX_USAGE


def _reason(exc: BaseException) -> str:
    """One line saying what went wrong: the broker's reply text when there is one."""
    text = getattr(exc, "reply_text", None) or str(exc) or type(exc).__name__
    code = getattr(exc, "reply_code", None) or getattr(exc, "code", None)
    if getattr(exc, "reply_text", None) and isinstance(code, int):
        text = f"({code}) {text}"
    return " ".join(str(text).split())


def check_broker_url(url: str) -> None:
    """Refuse a broker URL the ladder cannot run on, as a usage error.

    Raises:
        BadUsage: the URL's transport is not RabbitMQ's or the simulator's.
    """
    try:
        require_rabbitmq(url)
    except UnsupportedBroker as exc:
        raise BadUsage(str(exc)) from None
    if url.lower().startswith("ladder-sim"):
        from .simulator.registry import install_scheme

        install_scheme()


def open_connection(url: str) -> Connection:
    """Return an unconnected :class:`kombu.Connection` to ``url`` after checking its transport.

    Raises:
        BadUsage: the URL is not a RabbitMQ (or simulator) URL, or cannot be parsed.
    """
    check_broker_url(url)
    try:
        return Connection(url, connect_timeout=CONNECT_TIMEOUT)
    except (ValueError, TypeError) as exc:
        raise BadUsage(E_BAD_URL.format(url=url, reason=_reason(exc))) from None


@contextmanager
def connected(connection: Connection) -> Iterator[Connection]:
    """Connect ``connection`` once, and turn the broker errors of the block into one line each.

    Raises:
        BrokerUnavailable: the broker is unreachable, refused the login, or the connection was lost.
        CommandError: the broker refused an operation (a channel error), or the ladder raised a
            :class:`~kombu_ladder.LadderError`.
    """
    url = f"{connection.transport_cls}://{connection.hostname}"
    try:
        url = connection.as_uri()  # creates the transport, which may already fail
        connection.ensure_connection(max_retries=1)
    except (OperationalError, *connection.connection_errors, *connection.channel_errors, OSError,
            ValueError) as exc:  # a refused login is a channel error; an unknown ladder-sim broker a ValueError
        raise BrokerUnavailable(E_CONNECT.format(url=url, reason=_reason(exc))) from None
    connection_errors = (OperationalError, *connection.connection_errors)
    try:
        yield connection
    except LadderError as exc:
        raise CommandError(" ".join(str(exc).split())) from None
    except connection.channel_errors as exc:
        raise CommandError(E_REFUSED.format(url=url, reason=_reason(exc))) from None
    except connection_errors as exc:
        raise BrokerUnavailable(E_LOST.format(url=url, reason=_reason(exc))) from None


def emit(text: str = "") -> None:
    """Print one line; a closed standard output (``| head``) ends the command quietly with status 1."""
    try:
        click.echo(text)
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's last flush cannot fail again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise click.exceptions.Exit(1) from None


def configure_logging(level: str = "INFO") -> None:
    """Log to stderr at ``level``, unless the process (Celery, a test) configured logging already."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


# -- the bodies ----------------------------------------------------------------


def declare(connection: Connection) -> None:
    """Declare the exchange, the rungs, the control and parking queues; print the contract's queue names."""
    for name in declare_topology(connection):
        emit(name)


def status_report(connection: Connection, *, parked: int = 100, due: bool = False) -> dict[str, Any]:
    """Return the ladder's queues and, when messages are parked, the reasons of the first ``parked``.

    With ``due``, also bounds on how many messages fall due within a minute, an hour and a day.
    """
    depths = queue_depths(connection)
    waiting = next((row.messages for row in depths if row.queue == PARKING), None) or 0
    reasons = parked_reasons(connection, limit=parked) if waiting and parked else []
    report: dict[str, Any] = {
        "queues": [row._asdict() for row in depths],
        "parked_reasons": [{"reason": reason, "count": count} for reason, count in reasons],
        "parked_looked_at": min(waiting, parked),
    }
    if due:
        report["due"] = [b.__dict__ for b in due_bounds({row.queue: row.messages for row in depths})]
    return report


def status_lines(report: dict[str, Any]) -> list[str]:
    """Render :func:`status_report`'s report: the queue table, then the tally of parked reasons."""
    lines = [I_STATUS_HEADER.format("queue", "messages", "consumers")]
    for row in (QueueDepth(**q) for q in report["queues"]):
        shown = ("missing", "-") if row.messages is None else (row.messages, row.consumers)
        lines.append(I_STATUS_HEADER.format(row.queue, *shown))
    if report["parked_reasons"]:
        lines += ["", I_PARKED_TITLE.format(report["parked_looked_at"])]
        lines += [f"{r['count']:>7}  {r['reason']}" for r in report["parked_reasons"]]
    if "due" in report:
        lines += ["", *due_lines([DueBound(**b) for b in report["due"]])]
    return lines


def status(connection: Connection, *, parked: int = 100, as_json: bool = False, due: bool = False) -> None:
    """Print each queue's depth and consumers and the tally of parked reasons (or one JSON document)."""
    report = status_report(connection, parked=parked, due=due)
    if as_json:
        emit(json.dumps(report, indent=2, sort_keys=True))
        return
    for line in status_lines(report):
        emit(line)


def cancel(connection: Connection, ids: Sequence[str], *, key: str = "message_id") -> None:
    """Record the cancellation of every id in ``ids`` (confirmed by the broker); print how many."""
    try:
        count = cancel_many(connection, ids, key=key)
    except (TypeError, ValueError) as exc:  # an id no message can have: say which rule it breaks
        raise BadUsage(str(exc)) from None
    emit(I_CANCELLED.format(count, STREAM))


def replay(connection: Connection, *, limit: Optional[int] = None, match: Optional[str] = None) -> None:
    """Send parked messages back to the control queue; print how many went and how many stayed."""
    declare_topology(connection)
    result = replay_parked(connection, limit=limit, match=match)
    emit(I_REPLAYED.format(result.replayed, CONTROL, result.kept))


def move(connection: Connection, to: str, *, limit: Optional[int] = None, keep_parked: bool = False) -> None:
    """Move the waiting ladder of ``connection``'s broker to the broker at ``to``; print the counts per queue."""
    with open_connection(to) as target, connected(target):
        result = move_ladder(connection, target, limit=limit, include_parked=not keep_parked)
    for name, count in result.moved.items():
        emit(I_STATUS_HEADER.format(name, count, "").rstrip())
    emit(I_MOVED.format(result.total))


def relay(connection: Connection, *, prefetch: int = PREFETCH, report_every: Optional[float] = 30.0,
          allowed_exchanges: Optional[Iterable[str]] = None, max_delay: float = MAX_DELAY,
          metrics_port: Optional[int] = None, metrics_address: str = "127.0.0.1",
          metrics_interval: float = 15.0, hold_window: float = HOLD_WINDOW, queue_type: str = "classic") -> None:
    """Run a relay on ``connection`` until SIGTERM or SIGINT (it logs its counters as it stops).

    With ``metrics_port``, it serves Prometheus metrics on ``metrics_address:metrics_port``
    from before it starts consuming until it stops.
    """
    allowed = list(allowed_exchanges) if allowed_exchanges is not None else None
    runner = Relay(connection, prefetch=prefetch, allowed_exchanges=allowed, report_every=report_every,
                   max_delay=max_delay, hold_window=hold_window, queue_type=queue_type)
    server = None
    if metrics_port is not None:
        # So the first sample, before the relay consumes, finds every queue.
        declare_topology(connection, queue_type=queue_type)
        server = metrics_server()(runner.counters, connection, port=metrics_port, address=metrics_address,
                                  interval=metrics_interval).start()
    try:
        runner.run_until_signalled()
    finally:
        if server is not None:
            server.stop()


def metrics_server() -> Any:
    """Return :class:`kombu_ladder.metrics.MetricsServer`.

    Raises:
        CommandError: prometheus-client is not installed (one line saying what to install).
    """
    try:
        from .metrics import MetricsServer
    except ModuleNotFoundError as exc:
        if exc.name != "prometheus_client":
            raise
        raise CommandError(str(exc)) from None
    return MetricsServer
