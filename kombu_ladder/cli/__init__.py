"""``kombu-ladder``: operate the ladder from a shell (a click application over :mod:`kombu_ladder.cli.commands`)."""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

import click
from kombu import Connection
from kombu.utils.url import maybe_sanitize_url

from .. import __version__
from ..brokers import BROKER_ENVS, DEFAULT_BROKER, broker_url
from ..compat import is_no_args_help
from ..depths import waiting_in_queues
from ..index import default_path
from ..link import clock_of
from ..relay import RelayOptions
from ..relay.driver import StopSignals
from . import checks, commands, console, options, oversight, waiting

__all__ = ["cli", "main", "BROKER_ENV", "Source", "SOURCE", "Command", "Group", "SHARED", "broker",
           "given_options"]

#: The environment variable that names the broker when ``--broker`` is not given (then ``CELERY_BROKER_URL``).
BROKER_ENV = BROKER_ENVS[0]

logger = logging.getLogger(__name__)

#: Levels ``--log-level`` accepts.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


#: The key of ``ctx.meta`` (shared by a command line's contexts) where ``--broker`` and ``--log-level`` are kept.
GIVEN = "kombu_ladder.given"
#: The key of ``ctx.meta`` where a command line that runs these commands (``celery ladder``) puts its :class:`Source`.
SOURCE = "kombu_ladder.source"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep an option given before or after the subcommand; the one nearer the subcommand wins."""
    if value is not None:
        ctx.meta.setdefault(GIVEN, {})[param.name] = value
    return value


class Source:
    """Where the commands find their broker, settings and words: ``--broker`` for ``kombu-ladder`` (this class);
    ``celery ladder`` puts one for the app in ``ctx.meta[SOURCE]`` (:class:`celery_ladder.cli.AppSource`)."""

    #: What a cancel records an id as.
    id_key = "message_id"

    def located(self) -> tuple[str, str]:
        """The broker URL and where it came from: ``--broker``, else the environment
        (:func:`~kombu_ladder.brokers.broker_url`: ``KOMBU_LADDER_BROKER``, then ``CELERY_BROKER_URL``), else the
        default."""
        return broker_url(_given().get("broker"), os.environ)

    @property
    def url(self) -> str:
        """The broker URL."""
        return self.located()[0]

    def connection(self) -> Connection:
        """An unconnected connection to :attr:`url` (checked first)."""
        return commands.open_connection(self.url)

    def relay_options(self, **given: Any) -> RelayOptions:
        """The relay's options: ``given`` (command line, environment) over the defaults."""
        return commands.relay_options(**given)

    def queue_type(self, given: Optional[str]) -> Optional[str]:
        """The queue profile a command uses: ``given``, else None (the one declared, else classic)."""
        return given

    def workers(self, timeout: Optional[float]) -> Optional[dict[str, Any]]:
        """The workers' relay counters for ``status`` (None: no workers to ask)."""
        return None

    def worker_lines(self, workers: dict[str, Any]) -> list[str]:
        """:meth:`workers` as lines."""
        return []

    def counters(self, relay_metrics: Sequence[str], timeout: Optional[float]) -> Optional[Callable[[], Any]]:
        """What the console reads relay counters from: standalone relays' ``--relay-metrics``."""
        return console.relay_scraper(relay_metrics)


def _given() -> dict[str, Any]:
    return click.get_current_context().meta.setdefault(GIVEN, {})


def _source() -> Source:
    return click.get_current_context().meta.get(SOURCE) or Source()


class Command(click.Command):
    """A command of both command lines: a bad option or argument is one ``Error:`` line, exit status 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if is_no_args_help(exc):
                raise
            raise commands.usage_line(exc, ctx.command_path) from None


class Group(click.Group):
    """A group whose commands are :class:`Command` s, and its subgroups such groups."""

    command_class = Command
    group_class = type


def _common_options(*, top: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--broker`` and ``--log-level``, accepted before the subcommand (``top``) and after it."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option(
            "--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), metavar="LEVEL",
            default=None, expose_value=False, callback=_remember,
            help="Logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL [default: INFO for relay; WARNING for "
                 "the commands that print their result].",
        )(f)
        return click.option(
            "--broker", metavar="URL", default=None, expose_value=False, callback=_remember,
            help=f"RabbitMQ URL [default: ${BROKER_ENVS[0]}, else ${BROKER_ENVS[1]}, else {DEFAULT_BROKER}]; "
                 f"without it, --log-level INFO says which one was used.",
        )(f)

    return decorate


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="kombu-ladder", message="%(prog)s %(version)s",
                      help="Print the version and exit.")
@_common_options(top=True)
def cli() -> None:
    """Operate the ladder of delayed messages (the AceMQ TTL queues) on RabbitMQ.

    \b
    --broker and --log-level go before or after the command:
      kombu-ladder status --broker amqp://guest:guest@localhost//
      kombu-ladder --broker amqp://guest:guest@localhost// status
    are the same. 'kombu-ladder COMMAND --help' shows a command's options.
    """


@contextmanager
def _broker(*, log_level: str = commands.QUIET_LOG_LEVEL) -> Iterator[Connection]:
    """The connected broker (``--broker``, or the Celery app's), with logging set up from ``--log-level``
    (else ``log_level``)."""
    commands.configure_logging(_given().get("log_level") or log_level)
    source = _source()
    with source.connection() as connection, commands.connected(connection):
        _say_broker(source)  # once connected: an error stays one line
        yield connection


def _say_broker(source: Source) -> None:
    """Log which broker a command uses and where it came from, so every command can say it: at INFO when it was
    not given (found in the environment, the app or the default: the surprising case), at DEBUG when it was."""
    url, origin = source.located()
    logger.log(logging.DEBUG if origin == "--broker" else logging.INFO, "broker %s (from %s)",
               maybe_sanitize_url(url), origin)


@cli.command()
@options.queue_type_option()
@_common_options(top=False)
def declare(queue_type: Optional[str]) -> None:
    """Declare the exchange, the rungs, the control and parking queues, and the cancellation stream.

    Prints the contract's queue names, longest rung first. Idempotent.
    """
    with _broker() as connection:
        commands.declare(connection, queue_type=_source().queue_type(queue_type))


@cli.command()
@options.parked_option()
@options.due_option()
@options.json_option()
@_common_options(top=False)
def status(parked: int, due: bool, as_json: bool, timeout: Optional[float] = None) -> None:
    """Show each rung's depth and consumers, the control and parking queues, and why messages are parked
    (and, in 'celery ladder', every worker's relay counters)."""
    source = _source()
    with _broker() as connection:
        report = commands.status_report(connection, parked=parked, due=due)
    workers = source.workers(timeout)
    if workers is not None:
        report["workers"] = workers
    if as_json:
        commands.emit(json.dumps(report, indent=2, sort_keys=True))
        return
    for line in commands.status_lines(report) + (["", *source.worker_lines(workers)] if workers is not None else []):
        commands.emit(line)


@cli.command()
@checks.min_relays_option()
@checks.max_backlog_option()
@checks.max_parked_option()
@options.json_option()
@options.queue_type_option(help="Check the topology against this profile [default: the profile the ladder is "
                                "declared with, else classic].")
@_common_options(top=False)
def check(min_relays: int, max_backlog: int, max_parked: Optional[int], as_json: bool,
          queue_type: Optional[str]) -> None:
    """Exit 0 if the ladder is healthy, else 1 with one line saying why (for probes and deploy scripts).

    Healthy: the exchange and queues are declared as the contract says, at least
    one relay consumes acemq.schedule.due, and fewer than --max-backlog messages
    wait there, and ladder.cancellations is the stream the relays read. Exit status
    69 when the broker cannot be reached.
    """
    with _broker() as connection:
        oversight.check(connection, min_relays=min_relays, max_backlog=max_backlog, max_parked=max_parked,
                        as_json=as_json, queue_type=_source().queue_type(queue_type))


@cli.command()
@click.argument("ids", metavar="ID...", nargs=-1, type=options.MessageId())
@waiting.task_option(help="Cancel every waiting Celery task of this name the index knows of.")
@waiting.target_option(help="Cancel every waiting message for this target exchange the index knows of ('' is the "
                            "default exchange; with --routing-key, only those).")
@waiting.routing_key_option()
@waiting.due_before_option()
@waiting.due_after_option()
@waiting.dry_run_option()
@waiting.index_option()
@_common_options(top=False)
def cancel(ids: tuple[str, ...], task: Optional[str], target: Optional[str], routing_key: Optional[str],
           due_before: Optional[int], due_after: Optional[int], dry_run: bool, index_path: Optional[str]) -> None:
    """Cancel waiting messages by id (an AMQP message id or a Celery task id), or in bulk with --task or --target.

    A cancellation is recorded in the ladder.cancellations stream for each id; every
    relay, including one started later, drops the message with that id that is
    waiting now at its next hop or delivery. Whether one is waiting is not checked; a
    message already delivered is not taken back, and one scheduled later with the
    same id is not cancelled.

    \b
    In bulk, the ids come from the index of waiting work (see 'waiting'), read
    up to date first: only messages scheduled with the index on are covered.
    --dry-run prints them and their count and records nothing.
    """
    found = waiting.filter_of(due_before=due_before, due_after=due_after, target=target, routing_key=routing_key,
                              task=task)
    source = _source()
    waiting.check_cancel(ids, found, command=click.get_current_context().command_path)
    with _broker() as connection:
        waiting.cancel(connection, ids, found, url=source.url, index_path=index_path, now=lambda: _now_ms(connection),
                       dry_run=dry_run, key=source.id_key)


def _now_ms(connection: Optional[Connection]) -> int:
    """Now in epoch ms: the broker's clock (virtual on the simulator), or the wall clock without one."""
    return int(clock_of(connection)() * 1000) if connection is not None else int(time.time() * 1000)


@contextmanager
def _index(index_path: Optional[str], no_sync: bool) -> Iterator[tuple[Any, int, Optional[Connection]]]:
    """The index (read up to date from --broker unless ``no_sync``), now in epoch ms, and the connection."""
    source = _source()
    url = source.url
    if no_sync:
        commands.configure_logging(_given().get("log_level") or commands.QUIET_LOG_LEVEL)
        _say_broker(source)
        store = waiting.open_index(url, index_path)
        try:
            yield store, _now_ms(None), None
        finally:
            store.close()
        return
    with _broker() as connection:
        store = waiting.open_index(url, index_path, connection)
        try:
            yield store, _now_ms(connection), connection
        finally:
            store.close()


@cli.group(name="waiting")
def waiting_group() -> None:
    """Find, list and count waiting messages in the index of waiting work (ladder.index).

    \b
    The index holds what producers with the index on scheduled (LadderProducer(index=True),
    Scheduler.on(index=True), Celery's ladder_index = True); each command first reads
    what is new in it into a local file (--no-sync: not). A message is waiting
    until its due time, unless a cancellation names it.
    """


@waiting_group.command(name="find")
@click.argument("ident", metavar="ID", type=options.MessageId())
@options.json_option()
@waiting.index_option()
@waiting.no_sync_option()
@_common_options(top=False)
def waiting_find(ident: str, as_json: bool, index_path: Optional[str], no_sync: bool) -> None:
    """Find a scheduled message by message id or Celery task id: due time, target, task, state.

    Exit status 1 when the index has no message with ID.
    """
    with _index(index_path, no_sync) as (store, now, _):
        waiting.find(store, ident, now, as_json=as_json)


def _waiting_filters(f: Any) -> Any:
    """``--due-before``, ``--due-after``, ``--target``, ``--routing-key``, ``--task`` and ``--everything``, in that
    order: what ``waiting list`` and ``waiting count`` select by."""
    for option in (waiting.everything_option, waiting.task_option, waiting.routing_key_option, waiting.target_option,
                   waiting.due_after_option, waiting.due_before_option):
        f = option()(f)
    return f


@waiting_group.command(name="list")
@_waiting_filters
@waiting.page_limit_option()
@waiting.page_offset_option()
@options.json_option()
@waiting.index_option()
@waiting.no_sync_option()
@_common_options(top=False)
def waiting_list(due_before: Optional[int], due_after: Optional[int], target: Optional[str],
                 routing_key: Optional[str], task: Optional[str], everything: bool, limit: int, offset: int,
                 as_json: bool, index_path: Optional[str], no_sync: bool) -> None:
    """List waiting messages, soonest due first, a page at a time."""
    found = waiting.filter_of(due_before=due_before, due_after=due_after, target=target, routing_key=routing_key,
                              task=task, everything=everything)
    with _index(index_path, no_sync) as (store, now, connection):
        in_queues = None if connection is None else waiting_in_queues(connection)
        waiting.listing(store, found, now, limit=limit, offset=offset, as_json=as_json, waiting_in_queues=in_queues)


@waiting_group.command(name="count")
@waiting.by_option()
@_waiting_filters
@options.json_option()
@waiting.index_option()
@waiting.no_sync_option()
@_common_options(top=False)
def waiting_count(by: Optional[str], due_before: Optional[int], due_after: Optional[int], target: Optional[str],
                  routing_key: Optional[str], task: Optional[str], everything: bool, as_json: bool,
                  index_path: Optional[str], no_sync: bool) -> None:
    """Count waiting messages: in all, or per due hour, target or Celery task name (--by)."""
    found = waiting.filter_of(due_before=due_before, due_after=due_after, target=target, routing_key=routing_key,
                              task=task, everything=everything)
    with _index(index_path, no_sync) as (store, now, _):
        waiting.count(store, found, now, by=by, as_json=as_json)


@cli.command()
@click.argument("ident", metavar="ID", type=options.MessageId())
@checks.find_limit_option()
@checks.every_option()
@options.json_option()
@_common_options(top=False)
def find(ident: str, limit: int, every: bool, as_json: bool) -> None:
    """Find a waiting message by message id or Celery task id: its rung, due time and target.

    It looks into the rungs, longest first, then acemq.schedule.due and
    acemq.schedule.parked, and puts every message back at its place. Exit
    status 1 when no waiting message has ID.
    """
    with _broker() as connection:
        oversight.find_message(connection, ident, limit=limit, every=every, as_json=as_json)


@cli.command(context_settings=options.NEGATIVE_ARGUMENTS)
@click.argument("ident", metavar="ID", type=options.MessageId())
@click.argument("when", metavar="WHEN", type=options.When())
@checks.find_limit_option()
@options.json_option()
@_common_options(top=False)
def reschedule(ident: str, when: Any, limit: int, as_json: bool) -> None:
    """Make a waiting message due at WHEN: seconds (0: now) or a duration from now (+10m, -30s, 2h30m), or an
    ISO 8601 time (UTC when it gives no offset).

    ID is a message id or a Celery task id. The message is found as 'find' finds
    it, then, in one transaction, a copy due at WHEN goes into acemq.schedule.due
    and the original is taken: it reaches its target once. A Celery task gets WHEN
    as its eta. Exit status 1 when no waiting message has ID (nothing is moved).
    """
    with _broker() as connection:
        oversight.move_message(connection, ident, when, limit=limit, as_json=as_json)


@cli.command(name="run-now")
@click.argument("ident", metavar="ID", type=options.MessageId())
@checks.find_limit_option()
@options.json_option()
@_common_options(top=False)
def run_now(ident: str, limit: int, as_json: bool) -> None:
    """Deliver a waiting message now: 'reschedule ID 0'."""
    with _broker() as connection:
        oversight.move_message(connection, ident, 0.0, limit=limit, as_json=as_json)


@cli.command()
@options.limit_option(help="Replay at most N parked messages.")
@options.match_option()
@options.queue_type_option()
@_common_options(top=False)
def replay(limit: Optional[int], match: Optional[str], queue_type: Optional[str]) -> None:
    """Send parked messages back through the relay, once their route is fixed.

    Each is confirmed on the control queue before it leaves the parking queue.
    """
    with _broker() as connection:
        commands.replay(connection, limit=limit, match=match, queue_type=_source().queue_type(queue_type))


@cli.command()
@click.option("--to", required=True, metavar="URL", help="The broker to fill (--broker is the one emptied).")
@options.limit_option(help="Move at most N messages from each queue.")
@click.option("--keep-parked", is_flag=True, help="Leave acemq.schedule.parked where it is.")
@options.queue_type_option(help="The queue profile to declare on --to [default: the one declared there, else "
                                "the one declared on --broker, else classic].")
@_common_options(top=False)
def move(to: str, limit: Optional[int], keep_parked: bool, queue_type: Optional[str]) -> None:
    """Move the waiting ladder from --broker to the broker at --to (blue-green), keeping every due time."""
    with _broker() as connection:
        commands.move(connection, to, limit=limit, keep_parked=keep_parked, queue_type=_source().queue_type(queue_type))


@cli.command()
@options.tunable_options
@options.report_every_option()
@options.metrics_port_option()
@options.metrics_address_option()
@options.metrics_interval_option()
@_common_options(top=False)
def relay(report_every: float, metrics_port: Optional[int], metrics_address: str, metrics_interval: float,
          **tuning: Any) -> None:
    """Run a relay on --broker until SIGTERM or SIGINT (celery ladder: on the app's broker).

    It consumes acemq.schedule.due, hops each expired message into the next
    rung or delivers it to its target, and parks what it cannot deliver.
    Run one or more beside your consumers when no Celery worker relays.
    With --metrics-port it serves Prometheus metrics at /metrics. An option
    not given comes from its environment variable, then (celery ladder) the
    app's setting, then its default.
    """
    signals = StopSignals().install()  # first: a SIGTERM at any later moment is a clean stop
    if metrics_port is not None:
        commands.metrics_server()  # prometheus-client missing: say so before connecting
    source, values = _source(), options.given(tuning)
    queue_type = source.queue_type(values.pop("queue_type", None))
    tuned = source.relay_options(**values)
    with _broker(log_level="INFO") as connection:
        commands.relay(connection, options=tuned, report_every=report_every, metrics_port=metrics_port,
                       metrics_address=metrics_address, metrics_interval=metrics_interval, queue_type=queue_type,
                       signals=signals)


@cli.command()
@console.web_options()
@console.relay_metrics_option()
@waiting.index_option()
@_common_options(top=False)
def web(host: str, port: int, read_only: bool, user: str, password_file: Optional[str], token_file: Optional[str],
        refresh: float, page_size: int, look_limit: int, relay_metrics: Sequence[str],
        index_path: Optional[str], timeout: Optional[float] = None) -> None:
    """Serve the web console: what waits and when, what was parked, and the actions (needs the [web] extra).

    \b
    It listens on 127.0.0.1 unless --host says otherwise; any other address needs
    credentials (--password-file for HTTP basic, --token-file for a bearer token).
    Every action is a POST with a CSRF token, behind a confirmation page;
    --read-only removes them all. Queue depths, the index and the relays are read
    once every --refresh seconds, however many people watch; --relay-metrics adds
    standalone relays' counters.
    """
    console.require_extra()
    settings = console.console_options(host=host, port=port, read_only=read_only, user=user,
                                       password_file=password_file, token_file=token_file, refresh=refresh,
                                       page_size=page_size, look_limit=look_limit)
    source = _source()
    counters = source.counters(relay_metrics, timeout)
    with _broker(log_level="INFO") as connection:
        console.serve(connection, settings, index_path=index_path or default_path(source.url), counters=counters,
                      log_level=_given().get("log_level") or "INFO")


#: For a command line that adds its own commands beside these (``celery ladder adopt``).
broker, given_options = _broker, _given

#: The commands ``celery ladder`` runs as they are (the same objects); it adds its own beside them.
SHARED = ("declare", "status", "check", "cancel", "waiting", "find", "reschedule", "run-now", "replay", "move",
          "relay", "web")


def main(argv: Optional[Sequence[str]] = None, *, prog_name: str = "kombu-ladder") -> int:
    """Run ``kombu-ladder`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Every error is one line on stderr: ``Error: ...``.
    """
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name=prog_name,
                          standalone_mode=False)
    except click.UsageError as exc:
        if is_no_args_help(exc):  # click 8.2+ (see kombu_ladder.compat)
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
            return exc.exit_code
        line = commands.usage_line(exc, prog_name)
        line.show()
        return line.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return result if isinstance(result, int) else 0
