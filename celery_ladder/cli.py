"""``celery ladder`` commands (status, check, show, cancel, reschedule, run-now, adopt, declare, relay) and the
``-P ladder`` pool (celery.commands plugin).

The command bodies are :mod:`kombu_ladder.cli.commands`, the ones ``kombu-ladder``
runs: these wrappers hand them the app's connection and settings, so output
and error handling are the same in both command lines.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import click
from celery.bin.base import CeleryCommand, CeleryOption, handle_preload_options
from kombu import Connection

from kombu_ladder.cli import checks, commands, console, options, oversight, waiting
from kombu_ladder.index import default_path
from kombu_ladder.link import clock_of

from . import control  # noqa: F401 - the CLI process must know ``inspect ladder``
from .adoption.drain import DrainReport, drain
from .adoption.records import threshold
from .control import COUNTER_NAMES
from .pool import register_pool_alias
from .settings import LadderSettings

__all__ = ["ladder", "LadderCommand", "worker_counters", "worker_lines", "MAX_TIMEOUT", "adopt_lines"]

#: The longest ``status --timeout``: ten minutes (a worker that has not answered by then will not).
MAX_TIMEOUT = 600.0

E_UNENFORCED = ("the relay of {} does NOT enforce cancellations (it cannot read ladder.cancellations; "
                "see its log): a cancelled task may run")

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
    lines = [f"{'worker':<30} {'relay':>5} {'cancels':>7} " + " ".join(f"{n:>9}" for n in COUNTER_NAMES)]
    unenforced = []
    for host, counters in sorted(workers.items()):
        if "error" in counters:
            lines.append(f"{host:<30} {counters['error']}")
            continue
        relay = "yes" if counters.get("relay") else "no"
        enforced = {True: "yes", False: "NO", None: "-"}.get(counters.get("cancellations"), "?")
        if enforced == "NO":
            unenforced.append(host)
        lines.append(f"{host:<30} {relay:>5} {enforced:>7} "
                     + " ".join(f"{counters.get(n, 0):>9}" for n in COUNTER_NAMES))
    if unenforced:
        lines.append(E_UNENFORCED.format(", ".join(unenforced)))
    return lines


class LadderCommand(CeleryCommand):
    """A ``celery ladder`` command: a bad option or argument is one ``Error:`` line, exit status 2, as in
    ``kombu-ladder`` (click's own form is three lines: usage, a hint, the error)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise commands.usage_line(exc, ctx.command_path) from None


@contextmanager
def _broker(ctx: click.Context, *, log_level: str = commands.QUIET_LOG_LEVEL) -> Iterator[Connection]:
    """The app's broker connection, checked and connected as ``kombu-ladder`` does it."""
    app = ctx.obj.app
    commands.check_broker_url(str(app.conf.broker_write_url or app.conf.broker_url or "amqp://"))
    commands.configure_logging(log_level)
    with app.connection_for_write() as connection, commands.connected(connection):
        yield connection


def _settings(ctx: click.Context) -> LadderSettings:
    """The app's ladder settings; a bad one is a usage error naming it."""
    try:
        return LadderSettings.from_conf(ctx.obj.app.conf)
    except (TypeError, ValueError) as exc:  # a bad setting, named in the message
        raise commands.BadUsage(str(exc)) from None


#: ``status/web --timeout SECONDS``: how long the workers have to answer ``inspect ladder``.
timeout_option = options.shared_option("--timeout", cls=CeleryOption, default=1.0, show_default=True,
                                       type=options.Number(min=0, min_open=True, max=MAX_TIMEOUT), metavar="SECONDS")


@click.group(name="ladder")
def ladder() -> None:
    """Operate the ladder of delayed tasks (AceMQ TTL queues) on the app's broker."""


@ladder.command(cls=LadderCommand)
@options.parked_option(cls=CeleryOption, help_group="Status Options")
@options.due_option(cls=CeleryOption, help_group="Status Options")
@options.json_option(cls=CeleryOption, help_group="Status Options")
@timeout_option(help_group="Status Options", help="Seconds to wait for the workers' replies.")
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


@ladder.command(cls=LadderCommand)
@checks.min_relays_option(cls=CeleryOption, help_group="Check Options")
@checks.max_backlog_option(cls=CeleryOption, help_group="Check Options")
@checks.max_parked_option(cls=CeleryOption, help_group="Check Options")
@options.json_option(cls=CeleryOption, help_group="Check Options")
@options.queue_type_option(cls=CeleryOption, help_group="Check Options",
                           help="Check the topology against this profile [default: the app's ladder_queue_type].")
@click.pass_context
@handle_preload_options
def check(ctx: click.Context, min_relays: int, max_backlog: int, max_parked: Optional[int], as_json: bool,
          queue_type: Optional[str], **kwargs: Any) -> None:
    """Exit 0 if the app's ladder is healthy, else 1 with one line saying why (for probes and deploy scripts).

    Healthy: the exchange and queues are declared as the contract says, at least
    one relay consumes acemq.schedule.due, and fewer than --max-backlog messages
    wait there, and ladder.cancellations is the stream the relays read. Exit status
    69 when the broker cannot be reached.
    """
    settings = _settings(ctx)
    with _broker(ctx) as connection:
        oversight.check(connection, min_relays=min_relays, max_backlog=max_backlog, max_parked=max_parked,
                        as_json=as_json, queue_type=queue_type or settings.queue_type)


@ladder.command(cls=LadderCommand)
@click.argument("task_id", type=options.MessageId())
@checks.find_limit_option(cls=CeleryOption, help_group="Show Options")
@options.json_option(cls=CeleryOption, help_group="Show Options")
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


def _filter_options(group: str) -> Any:
    """``--due-before``, ``--due-after``, ``--target``, ``--routing-key``, ``--task`` as Celery options."""
    def decorate(f: Any) -> Any:
        for option in (waiting.task_option, waiting.routing_key_option, waiting.target_option,
                       waiting.due_after_option, waiting.due_before_option):
            f = option(cls=CeleryOption, help_group=group)(f)
        return f

    return decorate


def _url(ctx: click.Context) -> str:
    conf = ctx.obj.app.conf
    return str(conf.broker_write_url or conf.broker_url or "amqp://")


def _now_ms(connection: Any) -> int:
    return int(clock_of(connection)() * 1000)


@ladder.command(cls=LadderCommand, context_settings=options.NEGATIVE_ARGUMENTS)
@click.argument("task_id", type=options.MessageId())
@click.argument("when", metavar="WHEN", type=options.When())
@checks.find_limit_option(cls=CeleryOption, help_group="Show Options")
@options.json_option(cls=CeleryOption, help_group="Show Options")
@click.pass_context
@handle_preload_options
def reschedule(ctx: click.Context, task_id: str, when: Any, limit: int, as_json: bool, **kwargs: Any) -> None:
    """Make a waiting task due at WHEN: seconds (0: now) or a duration from now (+10m, -30s, 2h30m), or an ISO
    8601 time (UTC when it gives no offset).

    The task keeps its id, arguments, headers and queue, and gets WHEN as its eta;
    it runs once. Exit status 1 when no waiting task has TASK_ID (nothing moved).
    """
    with _broker(ctx) as connection:
        oversight.move_message(connection, task_id, when, limit=limit, as_json=as_json)


@ladder.command(cls=LadderCommand, name="run-now")
@click.argument("task_id", type=options.MessageId())
@checks.find_limit_option(cls=CeleryOption, help_group="Show Options")
@options.json_option(cls=CeleryOption, help_group="Show Options")
@click.pass_context
@handle_preload_options
def run_now(ctx: click.Context, task_id: str, limit: int, as_json: bool, **kwargs: Any) -> None:
    """Run a waiting task now: 'reschedule TASK_ID 0'."""
    with _broker(ctx) as connection:
        oversight.move_message(connection, task_id, 0.0, limit=limit, as_json=as_json)


@ladder.command(cls=LadderCommand)
@click.argument("task_ids", metavar="TASK_ID...", nargs=-1, type=options.MessageId())
@_filter_options("Cancel Options")
@waiting.dry_run_option(cls=CeleryOption, help_group="Cancel Options")
@waiting.index_option(cls=CeleryOption, help_group="Cancel Options")
@click.pass_context
@handle_preload_options
def cancel(ctx: click.Context, task_ids: tuple[str, ...], task: Optional[str], target: Optional[str],
           routing_key: Optional[str], due_before: Optional[int], due_after: Optional[int], dry_run: bool,
           index_path: Optional[str], **kwargs: Any) -> None:
    """Cancel tasks waiting in the ladder (countdown/ETA) by task id (or message id), or in bulk with --task or
    --target: no worker runs them.

    Recorded durably in the ladder.cancellations stream, so the cancellation holds
    across worker restarts, unlike 'celery control revoke' alone (which, with the
    ladder installed, records it too). It applies to the task with that id waiting
    now; whether one is waiting is not checked, and one sent later with the same id
    runs. In bulk the ids come from the index of waiting work (ladder_index = True;
    see 'celery ladder waiting'); --dry-run prints them and records nothing.
    """
    found = waiting.filter_of(due_before=due_before, due_after=due_after, target=target, routing_key=routing_key,
                              task=task)
    waiting.check_cancel(task_ids, found, command=f"{ctx.find_root().info_name} ladder cancel")
    with _broker(ctx) as connection:
        waiting.cancel(connection, task_ids, found, url=_url(ctx), index_path=index_path,
                       now=lambda: _now_ms(connection), dry_run=dry_run, key="task_id")


@ladder.group(name="waiting")
def waiting_group() -> None:
    """Find, list and count the tasks waiting in the ladder, from the index of waiting work (ladder_index)."""


@contextmanager
def _index(ctx: click.Context, index_path: Optional[str], no_sync: bool) -> Iterator[tuple[Any, int]]:
    if no_sync:
        store = waiting.open_index(_url(ctx), index_path)
        try:
            yield store, int(time.time() * 1000)
        finally:
            store.close()
        return
    with _broker(ctx) as connection:
        store = waiting.open_index(_url(ctx), index_path, connection)
        try:
            yield store, _now_ms(connection)
        finally:
            store.close()


def _index_options(f: Any) -> Any:
    for option in (waiting.no_sync_option, waiting.index_option, options.json_option):
        f = option(cls=CeleryOption, help_group="Waiting Options")(f)
    return f


@waiting_group.command(name="find", cls=LadderCommand)
@click.argument("ident", metavar="TASK_ID", type=options.MessageId())
@_index_options
@click.pass_context
@handle_preload_options
def waiting_find(ctx: click.Context, ident: str, as_json: bool, index_path: Optional[str], no_sync: bool,
                 **kwargs: Any) -> None:
    """Find a task (or message) by id in the index: due time, queue, task name, state. Exit status 1 if absent."""
    with _index(ctx, index_path, no_sync) as (store, now):
        waiting.find(store, ident, now, as_json=as_json)


@waiting_group.command(name="list", cls=LadderCommand)
@_filter_options("Waiting Options")
@waiting.everything_option(cls=CeleryOption, help_group="Waiting Options")
@waiting.page_limit_option(cls=CeleryOption, help_group="Waiting Options")
@waiting.page_offset_option(cls=CeleryOption, help_group="Waiting Options")
@_index_options
@click.pass_context
@handle_preload_options
def waiting_list(ctx: click.Context, due_before: Optional[int], due_after: Optional[int], target: Optional[str],
                 routing_key: Optional[str], task: Optional[str], everything: bool, limit: int, offset: int,
                 as_json: bool, index_path: Optional[str], no_sync: bool, **kwargs: Any) -> None:
    """List waiting tasks, soonest due first, a page at a time."""
    found = waiting.filter_of(due_before=due_before, due_after=due_after, target=target, routing_key=routing_key,
                              task=task, everything=everything)
    with _index(ctx, index_path, no_sync) as (store, now):
        waiting.listing(store, found, now, limit=limit, offset=offset, as_json=as_json)


@waiting_group.command(name="count", cls=LadderCommand)
@waiting.by_option(cls=CeleryOption, help_group="Waiting Options")
@_filter_options("Waiting Options")
@waiting.everything_option(cls=CeleryOption, help_group="Waiting Options")
@_index_options
@click.pass_context
@handle_preload_options
def waiting_count(ctx: click.Context, by: Optional[str], due_before: Optional[int], due_after: Optional[int],
                  target: Optional[str], routing_key: Optional[str], task: Optional[str], everything: bool,
                  as_json: bool, index_path: Optional[str], no_sync: bool, **kwargs: Any) -> None:
    """Count waiting tasks: in all, or per due hour, target or task name (--by)."""
    found = waiting.filter_of(due_before=due_before, due_after=due_after, target=target, routing_key=routing_key,
                              task=task, everything=everything)
    with _index(ctx, index_path, no_sync) as (store, now):
        waiting.count(store, found, now, by=by, as_json=as_json)


@ladder.command(cls=LadderCommand)
@click.option("--queue", "-Q", "queues", cls=CeleryOption, multiple=True, required=True, metavar="NAME",
              help_group="Adopt Options", help="The task queue to drain of its ETA tasks (repeatable).")
@click.option("--dry-run", cls=CeleryOption, is_flag=True, help_group="Adopt Options",
              help="Look at every message and count what would move; move nothing.")
@options.limit_option(cls=CeleryOption, help_group="Adopt Options", help="Look at most at N messages per queue.")
@options.json_option(cls=CeleryOption, help_group="Adopt Options")
@click.pass_context
@handle_preload_options
def adopt(ctx: click.Context, queues: tuple[str, ...], dry_run: bool, limit: Optional[int], as_json: bool,
          **kwargs: Any) -> None:
    """Move the ETA tasks already waiting in task queues into the ladder.

    An ETA task due further ahead than ladder_hold_window is copied into the
    ladder and acked in one transaction; the ladder delivers it to its queue when
    it is due. Every other message (no ETA, due soon) stays where it is, in its
    order; workers consuming the queue do not see those until the drain is done.
    """
    app = ctx.obj.app
    settings = _settings(ctx)
    reports = []
    with _broker(ctx) as connection:
        for queue in queues:
            try:
                report = drain(connection, queue, settings=settings, timezone=app.conf.timezone, dry_run=dry_run,
                               limit=limit)
            except LookupError as exc:
                raise commands.BadUsage(str(exc)) from None
            reports.append(report)
            if not as_json:
                for line in adopt_lines(report, settings):
                    commands.emit(line)
    if as_json:
        commands.emit(json.dumps([report.as_dict() for report in reports], indent=2, sort_keys=True))


def adopt_lines(report: DrainReport, settings: LadderSettings) -> list[str]:
    """What ``celery ladder adopt`` did to a queue (or, in a dry run, would do), in four lines."""
    would = "would " if report.dry_run else ""
    return [
        f"{report.queue}: looked at {report.looked_at} message(s)" + (", a dry run" if report.dry_run else ""),
        f"  {would}{'adopt' if would else 'adopted'} {report.adopted} ETA task(s) into the ladder",
        f"  {would}{'leave' if would else 'left'} {report.left} in place: {report.no_eta} without an ETA, "
        f"{report.due_soon} due within {threshold(settings.hold_window):g} s, {report.copies} ladder copies",
        f"  {would}{'ack' if would else 'acked'} {report.originals_dropped} redelivered original(s) of adopted tasks",
    ]


@ladder.command(cls=LadderCommand)
@console.web_options(cls=CeleryOption, help_group="Web Options")
@waiting.index_option(cls=CeleryOption, help_group="Web Options")
@timeout_option(help_group="Web Options", help="Seconds to wait for the workers' counters at each refresh.")
@click.pass_context
@handle_preload_options
def web(ctx: click.Context, host: str, port: int, read_only: bool, user: str, password_file: Optional[str],
        token_file: Optional[str], refresh: float, page_size: int, look_limit: int, index_path: Optional[str],
        timeout: float, **kwargs: Any) -> None:
    """Serve the web console on the app's broker, with every worker's relay counters (needs the [web] extra).

    It listens on 127.0.0.1 unless --host says otherwise; any other address needs
    credentials (--password-file for HTTP basic, --token-file for a bearer token).
    Every action is a POST with a CSRF token, behind a confirmation page;
    --read-only removes them all.
    """
    console.require_extra()
    settings = console.console_options(host=host, port=port, read_only=read_only, user=user,
                                       password_file=password_file, token_file=token_file, refresh=refresh,
                                       page_size=page_size, look_limit=look_limit)
    app = ctx.obj.app
    with _broker(ctx, log_level="INFO") as connection:
        console.serve(connection, settings, index_path=index_path or default_path(_url(ctx)),
                      counters=lambda: worker_counters(app, timeout=timeout), log_level="INFO")


@ladder.command(cls=LadderCommand)
@options.queue_type_option(cls=CeleryOption, help_group="Declare Options",
                           help="The queue profile to declare [default: the app's ladder_queue_type].")
@click.pass_context
@handle_preload_options
def declare(ctx: click.Context, queue_type: Optional[str], **kwargs: Any) -> None:
    """Declare the ladder's exchange, rungs, control and parking queues, and the cancellation stream."""
    settings = _settings(ctx)
    with _broker(ctx) as connection:
        commands.declare(connection, queue_type=queue_type or settings.queue_type)


@ladder.command(cls=LadderCommand)
@options.prefetch_option(cls=CeleryOption, help_group="Relay Options")
@options.report_every_option(cls=CeleryOption, help_group="Relay Options")
@options.metrics_port_option(cls=CeleryOption, help_group="Relay Options")
@options.metrics_address_option(cls=CeleryOption, help_group="Relay Options")
@options.metrics_interval_option(cls=CeleryOption, help_group="Relay Options")
@options.queue_type_option(cls=CeleryOption, help_group="Relay Options")
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
    settings = _settings(ctx)
    try:
        tuning = settings.relay_options(prefetch=prefetch)
    except (TypeError, ValueError) as exc:  # a bad option, named in the message
        raise commands.BadUsage(str(exc)) from None
    with _broker(ctx, log_level="INFO") as connection:
        commands.relay(connection, options=tuning, report_every=report_every, metrics_port=metrics_port,
                       metrics_address=metrics_address, metrics_interval=metrics_interval,
                       queue_type=queue_type or settings.queue_type)
