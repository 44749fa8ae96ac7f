"""``celery ladder status|check|show|declare|relay``, and the ``-P ladder`` pool name (a celery.commands plugin).

The command bodies are :mod:`kombu_ladder.commands`, the ones ``kombu-ladder``
runs: these wrappers hand them the app's connection and settings, so output
and error handling are the same in both command lines.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import click
from celery.bin.base import CeleryCommand, CeleryOption, handle_preload_options
from kombu import Connection

from kombu_ladder import checks, cli_options, commands, oversight

from . import control  # noqa: F401 - the CLI process must know ``inspect ladder``
from .control import COUNTER_NAMES
from .pool import register_pool_alias
from .settings import LadderSettings

__all__ = ["ladder", "worker_counters", "worker_lines"]

# The Celery CLI imports its celery.commands plugins before it parses any option,
# so ``celery worker -P ladder`` is accepted from here on.
register_pool_alias()


def worker_counters(app: Any, timeout: float = 1.0) -> dict[str, dict[str, Any]]:
    """Ask every worker for its ladder counters; return ``{hostname: counters}``.

    Workers that do not know the command (no ladder installed) answer with an error entry.
    """
    replies = app.control.broadcast("ladder", reply=True, timeout=timeout) or []
    out: dict[str, dict[str, Any]] = {}
    for reply in replies:
        out.update(reply)
    return out


def worker_lines(workers: dict[str, dict[str, Any]]) -> list[str]:
    """Render :func:`worker_counters`'s answer as a table, one worker a line."""
    if not workers:
        return ["no worker replied"]
    lines = [f"{'worker':<30} {'relay':>5} " + " ".join(f"{n:>9}" for n in COUNTER_NAMES)]
    for host, counters in sorted(workers.items()):
        if "error" in counters:
            lines.append(f"{host:<30} {counters['error']}")
            continue
        relay = "yes" if counters.get("relay") else "no"
        lines.append(f"{host:<30} {relay:>5} " + " ".join(f"{counters.get(n, 0):>9}" for n in COUNTER_NAMES))
    return lines


@contextmanager
def _broker(ctx: click.Context) -> Iterator[Connection]:
    """The app's broker connection, checked and connected as ``kombu-ladder`` does it."""
    app = ctx.obj.app
    commands.check_broker_url(str(app.conf.broker_write_url or app.conf.broker_url or "amqp://"))
    commands.configure_logging()
    with app.connection_for_write() as connection, commands.connected(connection):
        yield connection


@click.group(name="ladder")
def ladder() -> None:
    """Operate the ladder of delayed tasks (AceMQ TTL queues) on the app's broker."""


@ladder.command(cls=CeleryCommand)
@cli_options.parked_option(cls=CeleryOption, help_group="Status Options")
@cli_options.due_option(cls=CeleryOption, help_group="Status Options")
@cli_options.json_option(cls=CeleryOption, help_group="Status Options")
@click.option("--timeout", cls=CeleryOption, type=click.FloatRange(min=0), default=1.0, show_default=True,
              help_group="Status Options", help="Seconds to wait for the workers' replies.")
@click.pass_context
@handle_preload_options
def status(ctx: click.Context, parked: int, due: bool, as_json: bool, timeout: float, **kwargs: Any) -> None:
    """Show each rung's depth, why messages are parked, and every worker's relay counters."""
    with _broker(ctx) as connection:
        report = commands.status_report(connection, parked=parked, due=due)
    report["workers"] = worker_counters(ctx.obj.app, timeout=timeout)
    if as_json:
        commands.emit(json.dumps(report, indent=2, sort_keys=True))
        return
    for line in [*commands.status_lines(report), "", *worker_lines(report["workers"])]:
        commands.emit(line)


@ladder.command(cls=CeleryCommand)
@checks.min_relays_option(cls=CeleryOption, help_group="Check Options")
@checks.max_backlog_option(cls=CeleryOption, help_group="Check Options")
@checks.max_parked_option(cls=CeleryOption, help_group="Check Options")
@cli_options.json_option(cls=CeleryOption, help_group="Check Options")
@click.pass_context
@handle_preload_options
def check(ctx: click.Context, min_relays: int, max_backlog: int, max_parked: Optional[int], as_json: bool,
          **kwargs: Any) -> None:
    """Exit 0 if the app's ladder is healthy, else 1 with one line saying why (for probes and deploy scripts).

    Healthy: the exchange and queues are declared as the contract says, at least
    one relay consumes acemq.schedule.due, and fewer than --max-backlog messages
    wait there. Exit status 69 when the broker cannot be reached.
    """
    with _broker(ctx) as connection:
        oversight.check(connection, min_relays=min_relays, max_backlog=max_backlog, max_parked=max_parked,
                        as_json=as_json)


@ladder.command(cls=CeleryCommand)
@click.argument("task_id")
@checks.find_limit_option(cls=CeleryOption, help_group="Show Options")
@cli_options.json_option(cls=CeleryOption, help_group="Show Options")
@click.pass_context
@handle_preload_options
def show(ctx: click.Context, task_id: str, limit: int, as_json: bool, **kwargs: Any) -> None:
    """Show where a task sent with a countdown or ETA waits: its rung, due time and queue.

    'celery inspect scheduled' cannot: the task is in RabbitMQ, not in a worker,
    until it is due. Every message looked at is put back at its place. Exit
    status 1 when no waiting task has TASK_ID.
    """
    with _broker(ctx) as connection:
        oversight.find_message(connection, task_id, limit=limit, as_json=as_json)


@ladder.command(cls=CeleryCommand)
@click.argument("task_ids", metavar="TASK_ID...", nargs=-1, required=True)
@click.pass_context
@handle_preload_options
def cancel(ctx: click.Context, task_ids: tuple[str, ...], **kwargs: Any) -> None:
    """Cancel tasks waiting in the ladder (countdown/ETA): no worker ever runs them.

    Recorded durably in the ladder.cancellations stream, so the cancellation holds
    across worker restarts, unlike 'celery control revoke' alone (which, with the
    ladder installed, records it too).
    """
    with _broker(ctx) as connection:
        commands.cancel(connection, list(task_ids), key="task_id")


@ladder.command(cls=CeleryCommand)
@click.pass_context
@handle_preload_options
def declare(ctx: click.Context, **kwargs: Any) -> None:
    """Declare the ladder's exchange, rungs, control and parking queues."""
    with _broker(ctx) as connection:
        commands.declare(connection)


@ladder.command(cls=CeleryCommand)
@cli_options.prefetch_option(cls=CeleryOption, help_group="Relay Options")
@cli_options.report_every_option(cls=CeleryOption, help_group="Relay Options")
@cli_options.metrics_port_option(cls=CeleryOption, help_group="Relay Options")
@cli_options.metrics_address_option(cls=CeleryOption, help_group="Relay Options")
@cli_options.metrics_interval_option(cls=CeleryOption, help_group="Relay Options")
@cli_options.queue_type_option(cls=CeleryOption, help_group="Relay Options")
@click.pass_context
@handle_preload_options
def relay(ctx: click.Context, prefetch: int, report_every: Optional[float], metrics_port: Optional[int],
          metrics_address: str, metrics_interval: float, queue_type: Optional[str], **kwargs: Any) -> None:
    """Run a standalone relay on the app's broker until SIGTERM or SIGINT.

    It keeps to the app's ladder_allowed_exchanges, as the workers' relay does, and
    declares the app's ladder_queue_type unless --queue-type is given.
    With --metrics-port it serves Prometheus metrics at /metrics.
    """
    if metrics_port is not None:
        commands.metrics_server()  # prometheus-client missing: say so before connecting
    try:
        settings = LadderSettings.from_conf(ctx.obj.app.conf)
    except (TypeError, ValueError) as exc:  # a bad setting, named in the message
        raise commands.BadUsage(str(exc)) from None
    with _broker(ctx) as connection:
        commands.relay(connection, prefetch=prefetch, report_every=report_every,
                       allowed_exchanges=settings.allowed_exchanges, max_delay=settings.max_delay,
                       metrics_port=metrics_port, metrics_address=metrics_address, metrics_interval=metrics_interval,
                       queue_type=queue_type or settings.queue_type)
