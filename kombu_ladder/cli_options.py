"""The options both command lines share (``kombu-ladder`` and ``celery ladder``): click decorators."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import click

from .contract import PREFETCH
from .plan import MAX_DELAY
from .timing import HOLD_WINDOW

__all__ = [
    "shared_option", "parked_option", "due_option", "json_option", "limit_option", "match_option",
    "prefetch_option", "hold_window_option", "max_delay_option", "report_every_option", "allow_exchange_option",
    "queue_type_option", "metrics_port_option", "metrics_address_option", "metrics_interval_option",
    "allowed_or_none",
]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _option(*names: str, **fixed: Any) -> Callable[..., Decorator]:
    def factory(**extra: Any) -> Decorator:
        return click.option(*names, **{**fixed, **extra})

    return factory


#: Make an option both command lines share: ``shared_option("--x", ...)(cls=CeleryOption, ...)``.
shared_option = _option

#: ``status --parked N``.
parked_option = _option(
    "--parked", type=click.IntRange(min=0), default=100, show_default=True, metavar="N",
    help="Tally the parked reasons of the first N parked messages (0: none); they are only looked at.")
#: ``status --due``.
due_option = _option("--due", is_flag=True, help="Also bound how many messages fall due within a minute, an "
                                                  "hour and a day, from the rung depths.")
#: ``status --json``.
json_option = _option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
#: ``replay/move --limit N``.
limit_option = _option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
                       help="At most N messages (per queue for move).")
#: ``replay --match TEXT``.
match_option = _option("--match", default=None, metavar="TEXT",
                       help="Only messages whose x-ladder-parked-reason contains TEXT.")
#: ``relay --prefetch N``.
prefetch_option = _option("--prefetch", type=click.IntRange(min=1, max=65535), default=PREFETCH, show_default=True,
                          metavar="N", help="Expired messages the relay takes at once for hops and deliveries "
                                            "(the contract's 50); held messages get room of their own.")
#: ``relay --hold-window SECONDS``.
hold_window_option = _option(
    "--hold-window", type=click.FloatRange(min=0, max=600), default=HOLD_WINDOW, show_default=True,
    metavar="SECONDS", help="Hold a message whose remaining delay is below this, unacked, and deliver it at its "
                            "due time (0: off, deliveries up to 1 s early).")
#: ``relay --max-delay SECONDS``.
max_delay_option = _option(
    "--max-delay", type=click.FloatRange(min=0, min_open=True), default=float(MAX_DELAY), metavar="SECONDS",
    help="Park, as malformed, a message due further ahead than this (default: ten years; a sanity bound that "
         "catches due times in the wrong unit). Match the producers' max_delay.")
#: ``relay --report-every SECONDS``.
report_every_option = _option("--report-every", type=click.FloatRange(min=0, min_open=True), default=30.0,
                              show_default=True, metavar="SECONDS", help="Log the relay's counters this often.")
#: ``relay --allow-exchange NAME`` (repeatable).
allow_exchange_option = _option(
    "--allow-exchange", "allowed_exchanges", multiple=True, metavar="NAME",
    help="Deliver only to this target exchange; others are parked (repeatable; '' is the default exchange).")


#: ``relay --queue-type classic|quorum``.
queue_type_option = _option(
    "--queue-type", type=click.Choice(["classic", "quorum"]), default=None, metavar="classic|quorum",
    help="Declare the contract's classic queues (the default) or replicated quorum queues (off-contract: "
         "every peer on the vhost must choose quorum too).")
#: ``relay --metrics-port PORT``.
metrics_port_option = _option(
    "--metrics-port", type=click.IntRange(min=0, max=65535), default=None, metavar="PORT",
    help="Serve Prometheus metrics on this port at /metrics (needs the prometheus extra; 0: any free port).")
#: ``relay --metrics-address ADDRESS``.
metrics_address_option = _option("--metrics-address", default="127.0.0.1", show_default=True, metavar="ADDRESS",
                                 help="The address --metrics-port listens on (0.0.0.0: every interface).")
#: ``relay --metrics-interval SECONDS``.
metrics_interval_option = _option(
    "--metrics-interval", type=click.FloatRange(min=0, min_open=True), default=15.0, show_default=True,
    metavar="SECONDS", help="Sample the ladder's queue depths this often for the metrics (never per scrape).")


def allowed_or_none(names: Sequence[str]) -> Optional[list[str]]:
    """``--allow-exchange`` values as a relay's ``allowed_exchanges``: ``None`` (all) when none was given."""
    return list(names) or None
