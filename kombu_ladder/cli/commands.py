"""The ladder's commands, written once: ``kombu-ladder`` and ``celery ladder`` both run these bodies.

Each body takes a connected :class:`kombu.Connection` and writes its output with
:func:`emit`. :func:`open_connection` and :func:`connected` turn every broker
error into one line and an exit status, so no command prints a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

import click
from kombu import Connection
from kombu.exceptions import OperationalError

from ..brokers import UnsupportedBroker, require_rabbitmq
from ..cancellation.records import STREAM
from ..cancellation.stream import cancel_many, declare_cancellations
from ..contract import CONTROL, PARKING
from ..depths import QueueDepth, queue_depths
from ..errors import LadderError
from ..health import cancellation_findings, relay_count
from ..migrate import move as move_ladder
from ..observe import cancellations_enforced
from ..parking import parked_reasons
from ..parking import replay as replay_parked
from ..plan import DueBound, due_bounds
from ..relay import Relay, RelayOptions
from ..relay.driver import StopSignals
from ..topology import declare as declare_topology
from ..topology import declared_queue_type, resolve_queue_type

__all__ = [
    "CommandError", "BrokerUnavailable", "BadUsage", "usage_line",
    "open_connection", "check_broker_url", "connected", "emit", "configure_logging",
    "declare", "due_lines", "status_report", "status_lines", "cancel", "replay", "move", "relay_options",
    "relay", "metrics_server",
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
E_USAGE = "{message} (see '{command} --help')"
E_REFUSED = "the broker at {url} refused an operation: {reason}"
E_LOST = "lost the connection to the broker at {url}: {reason}"
I_STATUS_HEADER = "{:<26} {:>9} {:>9}"
I_PARKED_TITLE = "why they are parked (the first {}):"
I_REPLAYED = "replayed {} parked message(s) to {}; {} left parked"
I_MOVED_ROW = "{:<26} {:>9}"
I_MOVED = "moved {} message(s)"
I_MOVE_DROPPED = ("dropped {} cancelled message(s) instead of moving them (the source's ladder.cancellations "
                  "cancel them)")
I_MOVE_INDEXED = "indexed {} moved message(s) in the target's ladder.index (waiting find/list there after a sync)"
#: ``status --due``: the table's header and row, and what the bounds mean.
I_DUE_ROW = "{:<18} {:>9} {:>9}"
I_DUE_NOTE = ("bounds from the rung depths alone: a rung's messages fall due before the next",
              "longer rung's TTL has passed; the 1h rung and acemq.schedule.due may hold any due time")
I_CANCELLATIONS = "cancellations: {}"
E_CANCELLATIONS = "cancellations: PROBLEM: {}"
I_CANCELLED = ("recorded a cancellation for {} id(s) in {}: it applies to whichever message with that id "
               "(message id or Celery task id) is waiting now, which every relay drops at its next hop or "
               "delivery; whether one is waiting is not checked")

#: Log format of the commands that log (the relay).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Log level of the commands that print their result (all but ``relay``), unless ``--log-level`` says
#: otherwise: the library logs what they did at INFO, which would print each result twice.
QUIET_LOG_LEVEL = "WARNING"


class CommandError(click.ClickException):
    """A command failed for a reason the user can fix: shown as one ``Error:`` line, exit status 1."""


class BrokerUnavailable(CommandError):
    """The broker cannot be reached, refused the login, or went away: exit status 69."""

    exit_code = EX_UNAVAILABLE


class BadUsage(CommandError):
    """An option value the ladder cannot work with, such as a Redis URL: exit status 2."""

    exit_code = EX_USAGE


def usage_line(exc: click.UsageError, command: str) -> BadUsage:
    """A click usage error (a bad option value, an unknown option) as one ``Error:`` line, exit status 2.

    The line names the option and where to read about it; click's own form is three
    lines (usage, a hint, the error), and both command lines print this one instead.
    """
    path = exc.ctx.command_path if exc.ctx is not None else command
    return BadUsage(E_USAGE.format(message=exc.format_message(), command=path))


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


def configure_logging(level: str = QUIET_LOG_LEVEL) -> None:
    """Log to stderr at ``level``, unless the process (Celery, a test) configured logging already."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


# -- the bodies ----------------------------------------------------------------


def declare(connection: Connection, *, queue_type: Optional[str] = None) -> None:
    """Declare the exchange, the rungs, the control and parking queues; print the contract's queue names.

    ``queue_type`` is the profile (default: the one already declared, else classic; see
    :func:`~kombu_ladder.topology.resolve_queue_type`). The cancellation stream, its exchange and
    their binding are declared too: a canceller with its minimal permissions may only publish to
    that exchange.
    """
    for name in declare_topology(connection, queue_type=resolve_queue_type(connection, queue_type)):
        emit(name)
    declare_cancellations(connection)


def status_report(connection: Connection, *, parked: int = 100, due: bool = False) -> dict[str, Any]:
    """Return the ladder's queues, whether ``ladder.cancellations`` can be enforced, and, when messages are
    parked, the reasons of the first ``parked``.

    With ``due``, also bounds on how many messages fall due within a minute, an hour and a day.
    """
    depths = queue_depths(connection)
    waiting = next((row.messages for row in depths if row.queue == PARKING), None) or 0
    reasons = parked_reasons(connection, limit=parked) if waiting and parked else []
    report: dict[str, Any] = {
        "queues": [row._asdict() for row in depths],
        "parked_reasons": [{"reason": reason, "count": count} for reason, count in reasons],
        "parked_looked_at": min(waiting, parked),
        "cancellations": cancellation_findings(connection, relays=relay_count(depths))[0].__dict__,
    }
    if due:
        report["due"] = [b.__dict__ for b in due_bounds({row.queue: row.messages for row in depths})]
    return report


def due_lines(bounds: list[DueBound]) -> list[str]:
    """Render :func:`~kombu_ladder.plan.due_bounds` as a table with a note on how exact it is."""
    lines = [I_DUE_ROW.format("falls due within", "at least", "at most")]
    lines += [I_DUE_ROW.format(b.label, b.at_least, b.at_most) for b in bounds]
    return [*lines, *I_DUE_NOTE]


def status_lines(report: dict[str, Any]) -> list[str]:
    """Render :func:`status_report`'s report: the queue table, then the tally of parked reasons."""
    lines = [I_STATUS_HEADER.format("queue", "messages", "consumers")]
    for row in (QueueDepth(**q) for q in report["queues"]):
        shown = ("missing", "-") if row.messages is None else (row.messages, row.consumers)
        lines.append(I_STATUS_HEADER.format(row.queue, *shown))
    cancellations = report.get("cancellations")
    if cancellations is not None:
        lines += ["", (I_CANCELLATIONS if cancellations["ok"] else E_CANCELLATIONS).format(cancellations["detail"])]
    if report["parked_reasons"]:
        lines += ["", I_PARKED_TITLE.format(report["parked_looked_at"])]
        lines += [f"{r['count']:>7}  {r['reason']}" for r in report["parked_reasons"]]
    if "due" in report:
        lines += ["", *due_lines([DueBound(**b) for b in report["due"]])]
    return lines


def cancel(connection: Connection, ids: Sequence[str], *, key: str = "message_id") -> None:
    """Record a cancellation for every id in ``ids`` (confirmed by the broker); print how many were recorded.

    An id is a message id or a Celery task id (``key`` says which the caller meant; relays match both).
    Nothing says whether a message with the id is waiting: the output claims only the records.
    """
    try:
        count = cancel_many(connection, ids, key=key)
    except (TypeError, ValueError) as exc:  # an id no message can have: say which rule it breaks
        raise BadUsage(str(exc)) from None
    emit(I_CANCELLED.format(count, STREAM))


def replay(connection: Connection, *, limit: Optional[int] = None, match: Optional[str] = None,
           queue_type: Optional[str] = None) -> None:
    """Send parked messages back to the control queue; print how many went and how many stayed.

    The ladder is declared first, in ``queue_type``'s profile (default: the one already declared).
    """
    declare_topology(connection, queue_type=resolve_queue_type(connection, queue_type))
    result = replay_parked(connection, limit=limit, match=match)
    emit(I_REPLAYED.format(result.replayed, CONTROL, result.kept))


def move(connection: Connection, to: str, *, limit: Optional[int] = None, keep_parked: bool = False,
         queue_type: Optional[str] = None) -> None:
    """Move the waiting ladder of ``connection``'s broker to the broker at ``to``; print the counts per queue.

    ``to``'s ladder is declared in ``queue_type``'s profile; by default the one declared there already,
    else the one of ``connection``'s broker, else classic.
    """
    with open_connection(to) as target, connected(target):
        if queue_type is None:
            queue_type = declared_queue_type(target) or resolve_queue_type(connection)
        result = move_ladder(connection, target, limit=limit, include_parked=not keep_parked,
                             queue_type=resolve_queue_type(target, queue_type))
    emit(I_MOVED_ROW.format("queue", "moved"))
    for name, count in result.moved.items():
        emit(I_MOVED_ROW.format(name, count))
    emit(I_MOVED.format(result.total))
    dropped = sum(result.cancelled.values())
    if dropped:
        emit(I_MOVE_DROPPED.format(dropped))
    if result.indexed:
        emit(I_MOVE_INDEXED.format(result.indexed))


def relay_options(**values: Any) -> RelayOptions:
    """The relay's options from command-line values, a bad one as a usage error naming the option.

    Raises:
        BadUsage: a value is out of range or of the wrong type.
    """
    try:
        return RelayOptions(**values)
    except (TypeError, ValueError) as exc:
        raise BadUsage(str(exc)) from None


def relay(connection: Connection, *, options: RelayOptions, report_every: Optional[float] = 30.0,
          metrics_port: Optional[int] = None, metrics_address: str = "127.0.0.1",
          metrics_interval: float = 15.0, queue_type: Optional[str] = None,
          signals: Optional[StopSignals] = None) -> None:
    """Run a relay with ``options`` on ``connection`` until SIGTERM or SIGINT (it logs its counters as it stops).

    ``signals``: the stop signals' handlers, installed first thing at the start (installed here if None).

    It declares the ladder in ``queue_type``'s profile (default: the one already declared, else
    classic; it replaces ``options.queue_type``). With ``metrics_port``, it serves Prometheus metrics
    on ``metrics_address:metrics_port`` from before it starts consuming until it stops.
    """
    options = RelayOptions.of(options, queue_type=resolve_queue_type(connection, queue_type))
    runner = Relay(connection, options=options, report_every=report_every)
    server = None
    if metrics_port is not None:
        # So the first sample, before the relay consumes, finds every queue.
        declare_topology(connection, queue_type=options.queue_type)
        server = metrics_server()(runner.counters, connection, port=metrics_port, address=metrics_address,
                                  interval=metrics_interval,
                                  enforcing=lambda: cancellations_enforced(runner.core)).start()
    try:
        runner.run_until_signalled(signals)
    finally:
        if server is not None:
            server.stop()


def metrics_server() -> Any:
    """Return :class:`kombu_ladder.metrics.MetricsServer`.

    Raises:
        CommandError: prometheus-client is not installed (one line saying what to install).
    """
    try:
        from ..metrics import MetricsServer
    except ModuleNotFoundError as exc:
        if exc.name != "prometheus_client":
            raise
        raise CommandError(str(exc)) from None
    return MetricsServer
