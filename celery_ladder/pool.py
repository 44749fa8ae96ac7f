"""``-P ladder``: Celery's prefork pool, plus the ladder relay in the worker's consumer."""

from __future__ import annotations

from typing import Any

from celery.concurrency.prefork import TaskPool as PreforkTaskPool

__all__ = ["TaskPool", "POOL_NAME", "POOL_PATH", "register_pool_alias"]

#: The name given to ``celery worker -P``.
POOL_NAME = "ladder"

#: Where Celery finds the pool class, in its ``module:attribute`` notation.
POOL_PATH = "celery_ladder.pool:TaskPool"


class TaskPool(PreforkTaskPool):
    """The prefork pool; creating it adds the relay bootstep to the app.

    The worker creates its pool before its consumer, so the step is in
    ``app.steps['consumer']`` in time, and the step includes itself for this
    pool whatever ``ladder_relay`` says.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.app is not None:
            from . import add_relay_step

            add_relay_step(self.app)


def register_pool_alias() -> None:
    """Make ``ladder`` a pool name: in ``celery.concurrency.ALIASES`` and the worker's ``-P`` choices.

    Called when the Celery CLI loads the ``celery.commands`` plugins, which it
    does before it parses the worker's options. Idempotent.
    """
    from celery import concurrency
    from celery.bin.worker import worker as worker_command

    concurrency.ALIASES.setdefault(POOL_NAME, POOL_PATH)
    for param in worker_command.params:
        if param.name == "pool":
            choices = tuple(getattr(param.type, "choices", ()))
            if POOL_NAME not in choices:
                param.type.choices = (*choices, POOL_NAME)
