"""The ``-P ladder`` pool class: Celery's prefork pool, plus the ladder relay in the worker's consumer.

The module's last name is ``ladder`` on purpose: Celery labels the pool in the worker
banner (``concurrency: 2 (ladder)``) with the last part of the pool class's module.
"""

from __future__ import annotations

from typing import Any

from celery.concurrency.prefork import TaskPool as PreforkTaskPool

__all__ = ["TaskPool"]


class TaskPool(PreforkTaskPool):
    """The prefork pool; creating it adds the relay bootstep to the app.

    The worker creates its pool before its consumer, so the step is in
    ``app.steps['consumer']`` in time, and the step includes itself for this
    pool whatever ``ladder_relay`` says.
    """

    #: Read by the relay step: this pool always runs the relay, whatever ``ladder_relay`` says.
    with_relay = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.app is not None:
            from .. import add_relay_step

            add_relay_step(self.app)
