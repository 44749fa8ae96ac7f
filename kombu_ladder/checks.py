"""The options of ``check`` and ``find``, shared by ``kombu-ladder`` and ``celery ladder``."""

from __future__ import annotations

import click

from .cli_options import shared_option as _option
from .health import DEFAULT_MAX_BACKLOG
from .peek import DEFAULT_LIMIT

__all__ = ["min_relays_option", "max_backlog_option", "max_parked_option", "find_limit_option", "every_option"]

#: ``check --min-relays N``.
min_relays_option = _option("--min-relays", type=click.IntRange(min=0), default=1, show_default=True, metavar="N",
                            help="Fail when fewer relays consume acemq.schedule.due.")
#: ``check --max-backlog N``.
max_backlog_option = _option("--max-backlog", type=click.IntRange(min=1), default=DEFAULT_MAX_BACKLOG,
                             show_default=True, metavar="N",
                             help="Fail when N or more expired messages wait in acemq.schedule.due.")
#: ``check --max-parked N``.
max_parked_option = _option("--max-parked", type=click.IntRange(min=0), default=None, metavar="N",
                            help="Fail when more than N messages are parked [default: not checked].")
#: ``find --limit N``.
find_limit_option = _option("--limit", type=click.IntRange(min=1), default=DEFAULT_LIMIT, show_default=True,
                            metavar="N", help="Look at N messages at most, over all the queues.")
#: ``find --all``.
every_option = _option("--all", "every", is_flag=True, help="Show every match, not only the first.")
