"""``celery inspect ladder``: each worker's relay counters, as a remote-control command."""

from __future__ import annotations

import sys
from typing import Any

from celery.worker.control import inspect_command

from .compat import allow_inspect_command
from .publish import scheduled_count

__all__ = ["ladder", "COUNTER_NAMES"]

#: The counters every worker reports, in this order.
COUNTER_NAMES = ("scheduled", "received", "delivered", "hops", "malformed", "parked", "refused", "cancelled")


@inspect_command()
def ladder(state: Any, **kwargs: Any) -> dict[str, Any]:
    """Return this worker's ladder counters.

    ``relay`` says whether the relay bootstep runs in this worker;
    ``scheduled`` counts the ETA tasks this worker (its pool processes
    included) put into the ladder; the rest are the relay's counters.
    """
    step = getattr(state.consumer, "ladder_relay", None)
    counters = step.counters.as_dict() if step is not None else {}
    report: dict[str, Any] = {"relay": step is not None, "scheduled": scheduled_count()}
    for name in COUNTER_NAMES[1:]:
        report[name] = counters.get(name, 0)
    return report


if "celery.bin.control" in sys.modules:  # a Celery CLI process: let "celery inspect ladder" through
    allow_inspect_command("ladder")
