"""What adoption decides for one task message, and its records in ``ladder.adoptions`` (pure: no kombu, no I/O)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from kombu_ladder.controlplane import ADOPTED, ADOPTIONS, MARKER
from kombu_ladder.controlplane import STREAM_ARGUMENTS as _STREAM_ARGUMENTS
from kombu_ladder.controlplane.codec import MAX_SMALL_BYTES, Adoption, RecordError
from kombu_ladder.controlplane.codec import encode as encode_record

__all__ = [
    "ADOPTED_HEADER", "STREAM", "STREAM_ARGUMENTS", "MARGIN_MS", "MIN_AHEAD", "RUN", "ADOPT", "CHECK",
    "Adoption", "RecordError", "Adopted", "threshold", "verdict", "encode",
]

#: The header an adopted copy carries, holding the ``eta`` it was adopted with. It tells the copy from
#: its original (both have the task's id and eta): a copy is never adopted again, whatever the clocks
#: say, and a worker strips it before Celery reads the message, so no retry inherits it. A task
#: message whose ``eta`` differs from it (a retry sent by a worker without the ladder) is an original.
ADOPTED_HEADER = "ladder_adopted"

#: The durable stream of adoption records, an extension of ours beside ``ladder.cancellations``
#: (no AceMQ peer reads it). A record is committed in the same transaction as its copy, so it
#: exists exactly when the copy does: a redelivered original found there was adopted already.
STREAM = ADOPTIONS
#: Its arguments: retention past the longest delay the ladder accepts (ten years), as the
#: cancellation stream's, since an original may come back as late as its copy is due.
STREAM_ARGUMENTS = dict(_STREAM_ARGUMENTS)

#: How long (ms) past its copy's due time a record is kept in memory: an original redelivered
#: later than that (its queue unconsumed for a day after its ETA) is no longer recognised.
MARGIN_MS = 24 * 3600 * 1000

#: Seconds: the least an ETA must be ahead to be adopted, whatever the hold window (the smallest rung).
MIN_AHEAD = 1.0

#: A record bigger than this is not one of ours: it is skipped unread.
MAX_RECORD_BYTES = MAX_SMALL_BYTES

#: Verdicts of :func:`verdict`: hand the message to Celery as it is; adopt it; look it up first.
RUN, ADOPT, CHECK = "run", "adopt", "check"

KIND_ADOPTED = ADOPTED.name
KIND_MARKER = MARKER.name


def threshold(hold_window: float) -> float:
    """Seconds an ETA must be ahead to be adopted: the hold window, and at least :data:`MIN_AHEAD`."""
    return max(float(hold_window), MIN_AHEAD)


def verdict(headers: Mapping[str, Any], *, redelivered: bool, due_ms: Optional[int], now_ms: int,
            ahead_ms: int) -> str:
    """What a worker does with a task message whose ``eta`` header reads ``due_ms`` (None: unreadable).

    :data:`ADOPT` when it is due more than ``ahead_ms`` from ``now_ms``; :data:`CHECK` when the
    broker redelivered it (a worker that adopted it may have died before acking it: its record
    says); :data:`RUN` otherwise, and for an adopted copy (see :data:`ADOPTED_HEADER`).
    """
    eta = headers.get("eta")
    if due_ms is None or not eta or headers.get(ADOPTED_HEADER) == eta:
        return RUN
    if redelivered:
        return CHECK
    return ADOPT if due_ms - now_ms > ahead_ms else RUN


def encode(task_id: str, eta: str, *, due: int) -> bytes:
    """Return the record (JSON bytes) of the adoption of task ``task_id`` sent with ``eta``, due at ``due``.

    Raises:
        ValueError: an id or eta that is not a string of 1 to 255 characters, or a bad due time.
    """
    return encode_record(Adoption(task_id, eta, due))


class Adopted:
    """The tasks adopted so far, each by its id and ``eta``, kept until its due time plus ``margin_ms``."""

    def __init__(self, *, margin_ms: int = MARGIN_MS) -> None:
        self.margin_ms = margin_ms
        self._until: dict[tuple[str, str], int] = {}

    def add(self, record: Adoption, now_ms: int) -> bool:
        """Keep ``record``'s adoption; False (not kept) if it is past its due time plus the margin already."""
        until = record.due + self.margin_ms
        if until <= now_ms:
            return False
        key = (record.id, record.eta)
        self._until[key] = max(until, self._until.get(key, 0))
        return True

    def __contains__(self, task: object) -> bool:
        """Whether ``(task id, eta)`` was adopted."""
        return task in self._until

    def prune(self, now_ms: int) -> int:
        """Forget the adoptions past their due time plus the margin; return how many."""
        expired = [key for key, until in self._until.items() if until <= now_ms]
        for key in expired:
            del self._until[key]
        return len(expired)

    def clear(self) -> None:
        """Forget every adoption (the stream was deleted and declared again: it is read again)."""
        self._until.clear()

    def __len__(self) -> int:
        return len(self._until)
