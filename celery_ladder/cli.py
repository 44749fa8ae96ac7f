"""``celery ladder status|declare|relay``, and the ``-P ladder`` pool name (a celery.commands plugin)."""

from __future__ import annotations

import json
import logging
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption, handle_preload_options

from kombu_ladder.cli import queue_depths
from kombu_ladder.contract import PREFETCH
from kombu_ladder.relay import Relay
from kombu_ladder.topology import declare as declare_topology

from . import control  # noqa: F401 - the CLI process must know ``inspect ladder``
from .control import COUNTER_NAMES
from .pool import register_pool_alias
from .settings import LadderSettings

__all__ = ["ladder", "worker_counters"]

logger = logging.getLogger(__name__)

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


@click.group(name="ladder")
def ladder() -> None:
    """Operate the ladder of delayed tasks (AceMQ TTL queues)."""


@ladder.command(cls=CeleryCommand)
@click.option("--timeout", cls=CeleryOption, type=float, default=1.0, show_default=True,
              help_group="Status Options", help="Seconds to wait for the workers' replies.")
@click.option("--json", "as_json", cls=CeleryOption, is_flag=True, help_group="Status Options",
              help="Print one JSON document instead of tables.")
@click.pass_context
@handle_preload_options
def status(ctx: click.Context, timeout: float, as_json: bool, **kwargs: Any) -> None:
    """Show each rung's depth and every worker's relay counters."""
    app = ctx.obj.app
    with app.connection_for_write() as conn:
        depths = queue_depths(conn)
    workers = worker_counters(app, timeout=timeout)
    if as_json:
        ctx.obj.echo(json.dumps({
            "queues": [{"queue": q, "messages": m, "consumers": c} for q, m, c in depths],
            "workers": workers,
        }, indent=2, sort_keys=True))
        return
    ctx.obj.echo(f"{'queue':<26} {'messages':>9} {'consumers':>9}")
    for name, messages, consumers in depths:
        shown = ("missing", "-") if messages is None else (messages, consumers)
        ctx.obj.echo(f"{name:<26} {shown[0]:>9} {shown[1]:>9}")
    ctx.obj.echo("")
    if not workers:
        ctx.obj.echo("no worker replied")
        return
    ctx.obj.echo(f"{'worker':<30} {'relay':>5} " + " ".join(f"{n:>9}" for n in COUNTER_NAMES))
    for host, counters in sorted(workers.items()):
        if "error" in counters:
            ctx.obj.echo(f"{host:<30} {counters['error']}")
            continue
        relay = "yes" if counters.get("relay") else "no"
        ctx.obj.echo(f"{host:<30} {relay:>5} " + " ".join(f"{counters.get(n, 0):>9}" for n in COUNTER_NAMES))


@ladder.command(cls=CeleryCommand)
@click.pass_context
@handle_preload_options
def declare(ctx: click.Context, **kwargs: Any) -> None:
    """Declare the ladder's exchange, rungs, control and parking queues."""
    with ctx.obj.app.connection_for_write() as conn:
        for name in declare_topology(conn):
            ctx.obj.echo(name)


@ladder.command(cls=CeleryCommand)
@click.option("--prefetch", cls=CeleryOption, type=int, default=PREFETCH, show_default=True,
              help_group="Relay Options", help="Expired messages held at once.")
@click.option("--report-every", cls=CeleryOption, type=float, default=30.0, show_default=True,
              help_group="Relay Options", help="Log the counters this often (seconds).")
@click.pass_context
@handle_preload_options
def relay(ctx: click.Context, prefetch: int, report_every: float, **kwargs: Any) -> None:
    """Run a standalone relay until SIGTERM or SIGINT."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with ctx.obj.app.connection_for_write() as conn:
        settings = LadderSettings.from_conf(ctx.obj.app.conf)
        runner = Relay(conn, prefetch=prefetch, report_every=report_every,
                       allowed_exchanges=settings.allowed_exchanges, max_delay=settings.max_delay)
        runner.run_until_signalled()
        ctx.obj.echo(f"relay stopped: {runner.counters.as_dict()}")
