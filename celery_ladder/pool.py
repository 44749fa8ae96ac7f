"""``-P ladder``: the pool's name, where Celery finds it, and how the CLI learns both."""

from __future__ import annotations

from .concurrency.ladder import TaskPool

__all__ = ["TaskPool", "POOL_NAME", "POOL_PATH", "register_pool_alias"]

#: The name given to ``celery worker -P``.
POOL_NAME = "ladder"

#: Where Celery finds the pool class, in its ``module:attribute`` notation. The class's own
#: module: Celery 5.7 maps a pool class back to its alias by this path, and every release
#: labels the banner's pool with the module's last name (``concurrency: 2 (ladder)``).
POOL_PATH = "celery_ladder.concurrency.ladder:TaskPool"


def register_pool_alias() -> None:
    """Make ``ladder`` a pool name: in ``celery.concurrency.ALIASES`` and the worker's ``-P`` choices.

    Called when the Celery CLI loads the ``celery.commands`` plugins, which it
    does before it parses the worker's options. Idempotent.
    """
    from celery import concurrency
    from celery.bin.worker import worker as worker_command

    from .compat import add_choice

    concurrency.ALIASES.setdefault(POOL_NAME, POOL_PATH)
    add_choice(worker_command, "pool", POOL_NAME)  # the same click.Choice in Celery 5.3 to 5.7
