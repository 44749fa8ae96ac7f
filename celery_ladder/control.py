"""``celery inspect ladder``: each worker's relay counters, as a remote-control command."""

from __future__ import annotations

import sys
from typing import Any

from celery.worker.control import inspect_command

from .adoption import adoption_counts
from .compat import allow_inspect_command
from .publish import scheduled_count

__all__ = ["ladder", "COUNTER_NAMES"]

#: The counters every worker reports, in this order: its own process's, then its relay's.
COUNTER_NAMES = ("scheduled", "adopted", "originals_dropped", "received", "delivered", "hops", "malformed", "parked",
                 "refused", "cancelled")
#: The first relay counter in :data:`COUNTER_NAMES`.
_RELAY = COUNTER_NAMES.index("received")


@inspect_command()
def ladder(state: Any, **kwargs: Any) -> dict[str, Any]:
    """Return this worker's ladder counters.

    ``relay`` says whether the relay bootstep runs in this worker;
    ``cancellations`` whether that relay enforces cancellations now (it reads
    ``ladder.cancellations``; None without a relay); ``adopt`` whether the
    worker adopts ETA tasks sent without the ladder; ``scheduled`` counts the
    ETA tasks this worker (its pool processes included) put into the ladder,
    ``adopted`` the ones it moved there for others (``originals_dropped``:
    originals redelivered after their adoption, acked unrun); the rest are the
    relay's counters.
    """
    step = getattr(state.consumer, "ladder_relay", None)
    counters = step.counters.as_dict() if step is not None else {}
    report: dict[str, Any] = {"relay": step is not None, "scheduled": scheduled_count(),
                              "cancellations": step.enforcing() if step is not None else None,
                              "adopt": getattr(state.consumer, "ladder_adopt", None) is not None,
                              **adoption_counts()}
    for name in COUNTER_NAMES[_RELAY:]:
        report[name] = counters.get(name, 0)
    return report


if "celery.bin.control" in sys.modules:  # a Celery CLI process: let "celery inspect ladder" through
    allow_inspect_command("ladder")
