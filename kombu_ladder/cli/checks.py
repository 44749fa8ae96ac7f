"""The options of ``check`` and ``find``, shared by ``kombu-ladder`` and ``celery ladder``."""

from __future__ import annotations

from ..health import DEFAULT_MAX_BACKLOG
from ..peek import DEFAULT_LIMIT
from .options import MANY, Number
from .options import shared_option as _option

__all__ = ["min_relays_option", "max_backlog_option", "max_parked_option", "find_limit_option", "every_option"]

#: ``check --min-relays N``.
min_relays_option = _option(
    "--min-relays", type=Number(min=0, max=10_000, integer=True), default=1, show_default=True, metavar="N",
    help="Fail when fewer relays consume acemq.schedule.due (0: do not check the relays).")
#: ``check --max-backlog N``.
max_backlog_option = _option(
    "--max-backlog", type=Number(min=1, max=MANY, integer=True), default=DEFAULT_MAX_BACKLOG, show_default=True,
    metavar="N", help="Fail when N or more expired messages wait in acemq.schedule.due.")
#: ``check --max-parked N``.
max_parked_option = _option(
    "--max-parked", type=Number(min=0, max=MANY, integer=True), default=None, metavar="N",
    help="Fail when more than N messages are parked (0: when any is) [default: not checked].")
#: ``find --limit N``.
find_limit_option = _option(
    "--limit", type=Number(min=1, max=MANY, integer=True), default=DEFAULT_LIMIT, show_default=True, metavar="N",
    help="Look at N messages at most, over all the queues.")
#: ``find --all``.
every_option = _option("--all", "every", is_flag=True, help="Show every match, not only the first.")
