"""``kombu-ladder``: operate the ladder from a shell (a click application over :mod:`kombu_ladder.commands`)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

import click
from kombu import Connection

from . import checks, cli_options, commands, oversight
from .brokers import DEFAULT_BROKER
from .compat import is_no_args_help

__all__ = ["cli", "main", "BROKER_ENV"]

#: The environment variable that names the broker when ``--broker`` is not given.
BROKER_ENV = "KOMBU_LADDER_BROKER"

#: Levels ``--log-level`` accepts.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

E_USAGE = "{message} (see '{command} --help')"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep an option given before or after the subcommand; the one nearer the subcommand wins."""
    if value is not None:
        ctx.find_root().ensure_object(dict)[param.name] = value
    return value


def _common_options(*, top: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--broker`` and ``--log-level``, accepted before the subcommand (``top``) and after it."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option(
            "--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), metavar="LEVEL",
            default="INFO" if top else None, expose_value=False, callback=_remember,
            help="Logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL [default: INFO].",
        )(f)
        return click.option(
            "--broker", metavar="URL", default=DEFAULT_BROKER if top else None, envvar=BROKER_ENV if top else None,
            expose_value=False, callback=_remember,
            help=f"RabbitMQ URL [default: ${BROKER_ENV}, else {DEFAULT_BROKER}].",
        )(f)

    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@_common_options(top=True)
def cli() -> None:
    """Operate the ladder of delayed messages (the AceMQ TTL queues) on RabbitMQ.

    \b
    --broker and --log-level go before or after the command:
      kombu-ladder status --broker amqp://guest:guest@localhost//
      kombu-ladder --broker amqp://guest:guest@localhost// status
    are the same. 'kombu-ladder COMMAND --help' shows a command's options.
    """


def _options() -> dict[str, str]:
    return click.get_current_context().find_root().ensure_object(dict)


@contextmanager
def _broker() -> Iterator[Connection]:
    """The connected broker of ``--broker``, with logging set up from ``--log-level``."""
    options = _options()
    commands.configure_logging(options.get("log_level", "INFO"))
    with commands.open_connection(options.get("broker", DEFAULT_BROKER)) as connection, \
            commands.connected(connection):
        yield connection


@cli.command()
@_common_options(top=False)
def declare() -> None:
    """Declare the exchange, the rungs, the control and parking queues.

    Prints the contract's queue names, longest rung first. Idempotent.
    """
    with _broker() as connection:
        commands.declare(connection)


@cli.command()
@cli_options.parked_option()
@cli_options.due_option()
@cli_options.json_option()
@_common_options(top=False)
def status(parked: int, due: bool, as_json: bool) -> None:
    """Show each rung's depth and consumers, the control and parking queues, and why messages are parked."""
    with _broker() as connection:
        commands.status(connection, parked=parked, as_json=as_json, due=due)


@cli.command()
@checks.min_relays_option()
@checks.max_backlog_option()
@checks.max_parked_option()
@cli_options.json_option()
@_common_options(top=False)
def check(min_relays: int, max_backlog: int, max_parked: Optional[int], as_json: bool) -> None:
    """Exit 0 if the ladder is healthy, else 1 with one line saying why (for probes and deploy scripts).

    Healthy: the exchange and queues are declared as the contract says, at least
    one relay consumes acemq.schedule.due, and fewer than --max-backlog messages
    wait there. Exit status 69 when the broker cannot be reached.
    """
    with _broker() as connection:
        oversight.check(connection, min_relays=min_relays, max_backlog=max_backlog, max_parked=max_parked,
                        as_json=as_json)


@cli.command()
@click.argument("ids", metavar="MESSAGE_ID...", nargs=-1, required=True)
@_common_options(top=False)
def cancel(ids: tuple[str, ...]) -> None:
    """Cancel waiting messages by their AMQP message id: no relay delivers them.

    The cancellations are recorded in the ladder.cancellations stream; every relay,
    including one started later, drops these messages at their next hop or delivery.
    A message already delivered is not taken back.
    """
    with _broker() as connection:
        commands.cancel(connection, list(ids))


@cli.command()
@click.argument("ident", metavar="ID")
@checks.find_limit_option()
@checks.every_option()
@cli_options.json_option()
@_common_options(top=False)
def find(ident: str, limit: int, every: bool, as_json: bool) -> None:
    """Find a waiting message by message id or Celery task id: its rung, due time and target.

    It looks into the rungs, longest first, then acemq.schedule.parked, and puts
    every message back at its place. Exit status 1 when no waiting message has ID.
    """
    with _broker() as connection:
        oversight.find_message(connection, ident, limit=limit, every=every, as_json=as_json)


@cli.command()
@cli_options.limit_option()
@cli_options.match_option()
@_common_options(top=False)
def replay(limit: Optional[int], match: Optional[str]) -> None:
    """Send parked messages back through the relay, once their route is fixed.

    Each is confirmed on the control queue before it leaves the parking queue.
    """
    with _broker() as connection:
        commands.replay(connection, limit=limit, match=match)


@cli.command()
@click.option("--to", required=True, metavar="URL", help="The broker to fill (--broker is the one emptied).")
@cli_options.limit_option()
@click.option("--keep-parked", is_flag=True, help="Leave acemq.schedule.parked where it is.")
@_common_options(top=False)
def move(to: str, limit: Optional[int], keep_parked: bool) -> None:
    """Move the waiting ladder from --broker to the broker at --to (blue-green), keeping every due time."""
    with _broker() as connection:
        commands.move(connection, to, limit=limit, keep_parked=keep_parked)


@cli.command()
@cli_options.prefetch_option()
@cli_options.hold_window_option()
@cli_options.max_delay_option()
@cli_options.report_every_option()
@cli_options.allow_exchange_option()
@cli_options.metrics_port_option()
@cli_options.metrics_address_option()
@cli_options.metrics_interval_option()
@cli_options.queue_type_option()
@_common_options(top=False)
def relay(prefetch: int, hold_window: float, max_delay: float, report_every: float, allowed_exchanges: Sequence[str],
          metrics_port: Optional[int], metrics_address: str, metrics_interval: float,
          queue_type: Optional[str]) -> None:
    """Run a relay on --broker until SIGTERM or SIGINT.

    It consumes acemq.schedule.due, hops each expired message into the next
    rung or delivers it to its target, and parks what it cannot deliver.
    Run one or more beside your consumers when no Celery worker relays.
    With --metrics-port it serves Prometheus metrics at /metrics.
    """
    if metrics_port is not None:
        commands.metrics_server()  # prometheus-client missing: say so before connecting
    with _broker() as connection:
        commands.relay(connection, prefetch=prefetch, report_every=report_every,
                       allowed_exchanges=cli_options.allowed_or_none(allowed_exchanges), metrics_port=metrics_port,
                       metrics_address=metrics_address, metrics_interval=metrics_interval,
                       hold_window=hold_window, max_delay=max_delay, queue_type=queue_type or "classic")


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
        command = exc.ctx.command_path if exc.ctx else prog_name
        click.echo("Error: " + E_USAGE.format(message=exc.format_message(), command=command), err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return result if isinstance(result, int) else 0
