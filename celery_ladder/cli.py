"""``celery ladder``: the commands of ``kombu-ladder`` (the same click objects) on the app's broker and settings,
with ``adopt`` and ``--timeout`` beside them; and the ``-P ladder`` pool (celery.commands plugin)."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Optional, Sequence

import click
from celery.bin.base import CeleryOption, handle_preload_options
from kombu import Connection

from kombu_ladder.cli import SHARED, SOURCE, Command, Group, Source, broker, cli, commands, options
from kombu_ladder.cli import given_options as _given
from kombu_ladder.relay import RelayOptions

from . import control  # noqa: F401 - the CLI process must know ``inspect ladder``
from .adoption.drain import DrainReport, drain
from .adoption.records import threshold
from .control import COUNTER_NAMES
from .pool import register_pool_alias
from .settings import LadderSettings

__all__ = ["ladder", "AppSource", "LadderCommand", "worker_counters", "worker_lines", "MAX_TIMEOUT", "adopt_lines"]

#: A ``celery ladder`` command's class: the shared commands' (one ``Error:`` line for a bad option).
LadderCommand = Command

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


class AppSource(Source):
    """What the shared commands read in ``celery ladder``: the app's broker (unless ``--broker`` is given) and its
    ladder settings, which come after the command line and the environment (:data:`kombu_ladder.tuning.PRECEDENCE`)."""

    id_key = "task_id"

    def __init__(self, cli_context: Any) -> None:
        self._context = cli_context

    @property
    def app(self) -> Any:
        """The app of ``celery -A``."""
        return self._context.app

    def located(self) -> tuple[str, str]:
        """``--broker``, else the app's broker (``broker_write_url``, else ``broker_url``)."""
        given = _given().get("broker")
        if given:
            return str(given), "--broker"
        conf = self.app.conf
        return str(conf.broker_write_url or conf.broker_url or "amqp://"), "the Celery app's broker_url"

    def connection(self) -> Connection:
        if _given().get("broker"):
            return super().connection()
        commands.check_broker_url(self.url)
        return self.app.connection_for_write()

    def settings(self) -> LadderSettings:
        """The app's ladder settings; a bad one is a usage error naming it."""
        try:
            return LadderSettings.from_conf(self.app.conf)
        except (TypeError, ValueError) as exc:  # a bad setting, named in the message
            raise commands.BadUsage(str(exc)) from None

    def relay_options(self, **given: Any) -> RelayOptions:
        settings = self.settings()
        try:
            return settings.relay_options(**given)
        except (TypeError, ValueError) as exc:  # a bad option, named in the message
            raise commands.BadUsage(str(exc)) from None

    def queue_type(self, given: Optional[str]) -> Optional[str]:
        return given or self.settings().queue_type

    def workers(self, timeout: Optional[float]) -> Optional[dict[str, Any]]:
        return worker_counters(self.app, timeout=timeout or 1.0)

    def worker_lines(self, workers: dict[str, Any]) -> list[str]:
        return worker_lines(workers)

    def counters(self, relay_metrics: Sequence[str], timeout: Optional[float]) -> Optional[Callable[[], Any]]:
        app = self.app
        return super().counters(relay_metrics, timeout) or (lambda: worker_counters(app, timeout=timeout or 1.0))


def _settings(ctx: click.Context) -> LadderSettings:
    """The app's ladder settings; a bad one is a usage error naming it."""
    return AppSource(ctx.obj).settings()


def _timeout(help: str) -> click.Option:
    """``status/web --timeout SECONDS``: how long the workers have to answer ``inspect ladder`` (Celery only)."""
    return click.Option(["--timeout"], type=options.Number(min=0, min_open=True, max=MAX_TIMEOUT), default=1.0,
                        show_default=True, metavar="SECONDS", help=help)


#: The options only ``celery ladder`` has, by command: they live beside the shared ones.
CELERY_ONLY = {
    "status": _timeout("Seconds to wait for the workers' replies."),
    "web": _timeout("Seconds to wait for the workers' counters at each refresh."),
}


@click.group(name="ladder", cls=Group)
@click.pass_context
def ladder(ctx: click.Context) -> None:
    """Operate the ladder of delayed tasks (AceMQ TTL queues) on the app's broker: the commands of
    'kombu-ladder', with the app's broker and ladder settings, and 'adopt'."""
    ctx.meta[SOURCE] = AppSource(ctx.obj)


def _add_shared() -> None:
    for name in SHARED:
        command = cli.commands[name]
        if name in CELERY_ONLY:
            command = copy.copy(command)
            command.params = [*command.params, CELERY_ONLY[name]]
        ladder.add_command(command, name)
    show = copy.copy(cli.commands["find"])  # the old name of 'find' in 'celery ladder', kept for scripts
    show.hidden = True
    ladder.add_command(show, "show")


_add_shared()


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
    with broker() as connection:
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
