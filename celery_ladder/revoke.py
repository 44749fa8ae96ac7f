"""Celery's revoke, made durable for tasks in the ladder: it also records a ladder cancellation."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any, Optional

from celery.app.control import Control

from kombu_ladder.cancellation.stream import cancel_many

__all__ = ["LadderControl", "task_ids"]

logger = logging.getLogger(__name__)

E_RECORD = ("revoke of %s: recording the ladder cancellation failed (%s); only the workers alive now "
            "learn of the revoke, so a task still waiting in the ladder may run")


def task_ids(value: Any) -> list[str]:
    """The task ids of a revoke's ``task_id`` argument: one id, or a list of them (others are ignored)."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, (list, tuple, set, frozenset)):
        return [v for v in value if isinstance(v, str) and v]
    return []


class LadderControl(Control):
    """Celery's :class:`~celery.app.control.Control`, whose ``revoke`` broadcasts also record a ladder cancellation.

    Every revoke reaches :meth:`broadcast`: ``AsyncResult.revoke()``,
    ``app.control.revoke()`` and ``celery control revoke ID``. Each task id is
    recorded in ``ladder.cancellations`` (confirmed) before the broadcast, so a
    task waiting in the ladder is dropped by the relay whichever workers run
    when it falls due.
    """

    def broadcast(self, command: str, arguments: Optional[dict[str, Any]] = None, destination: Any = None,
                  connection: Any = None, *args: Any, **kwargs: Any) -> Any:
        if command == "revoke":
            self._record(task_ids((arguments or {}).get("task_id")), connection)
        return super().broadcast(command, arguments, destination, connection, *args, **kwargs)

    def _record(self, ids: list[str], connection: Any) -> None:
        if not ids:
            return
        try:
            context = nullcontext(connection) if connection is not None else self.app.connection_for_write()
            with context as conn:
                cancel_many(conn, ids, key="task_id")
        except Exception as exc:  # noqa: BLE001 - the revoke itself must still reach the workers
            logger.error(E_RECORD, ", ".join(ids), f"{type(exc).__name__}: {exc}")
