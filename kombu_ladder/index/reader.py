"""sync(): read ``ladder.index`` and ``ladder.cancellations`` from where the last sync stopped into an IndexStore."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Union

from ..cancellation.records import SLACK, read_from
from ..cancellation.records import STREAM as CANCELLATIONS
from ..controlplane.codec import Cancel, Entries
from ..controlplane.reader import NotReadToEnd, ReadError, StreamReader
from ..link import clock_of
from ..notices import Notices
from ..topology import declare_control_plane_if_allowed
from .records import STREAM as INDEX
from .store import IndexStore

__all__ = ["sync", "SyncResult", "IndexUnavailable", "default_path", "INDEX_ENV", "SYNC_TIMEOUT"]

logger = logging.getLogger("kombu_ladder.index")


#: The environment variable that names the index file when ``--index`` is not given.
INDEX_ENV = "KOMBU_LADDER_INDEX"
#: Seconds a sync waits, at most, for a stream to be read to its end.
SYNC_TIMEOUT = 300.0
#: Records read per SQLite transaction (and per remembered offset).
COMMIT_EVERY = 2000


class IndexUnavailable(Exception):
    """A stream of the index could not be read to its end (the message says which, and why)."""


@dataclass
class SyncResult:
    """What one :func:`sync` read."""

    #: Records read, entries added and cancellations read, per sync.
    records: int = 0
    entries: int = 0
    cancellations: int = 0
    #: Records skipped because they were not valid (untrusted input).
    skipped: int = 0
    #: Entries forgotten because they fell due more than a day ago.
    pruned: int = 0
    seconds: float = 0.0


def default_path(url: str) -> str:
    """The index file for the broker at ``url``: one per broker and vhost, under the user's cache directory
    (``$XDG_CACHE_HOME/kombu-ladder``, else ``~/.cache/kombu-ladder``), unless ``$KOMBU_LADDER_INDEX`` names one."""
    named = os.environ.get(INDEX_ENV)
    if named:
        return named
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return os.path.join(cache, "kombu-ladder", f"index-{digest}.sqlite")


class _Apply:
    """Applies the records of one stream to the store, and commits them with the position every
    :data:`COMMIT_EVERY` records (an interrupted sync goes on from there).

    Each batch's transaction begins at its first record and takes the write lock first (waiting for it):
    another sync writing the same file (the console's beside a command's) then waits for this batch, where a
    transaction that read first could not write once the other committed. No transaction is open between
    batches, while the stream is waited for."""

    def __init__(self, stream: str, store: IndexStore, result: SyncResult, reader: StreamReader) -> None:
        self.stream, self.store, self.result, self.reader = stream, store, result, reader
        self.unsaved = 0
        self.skipped = sum(reader.skipped.values())

    def __call__(self, record: Any, offset: Optional[int]) -> None:
        self.store.begin()  # the batch's first record: the lock first (else: already held)
        if isinstance(record, Entries) and self.stream == INDEX:
            self.store.add(record.entries)
            self.result.entries += len(record.entries)
        elif isinstance(record, Cancel) and self.stream == CANCELLATIONS:
            for each in record.each():
                self.store.cancel(each.id, each.at)
                self.result.cancellations += 1
        self.result.records += 1
        self.unsaved += 1
        if self.unsaved >= COMMIT_EVERY:
            self.save()

    def reset(self) -> None:
        """The stream was deleted and declared again: forget what was read of the old one."""
        self.store.forget(self.stream)
        self.store.commit()

    def save(self) -> None:
        """Commit what was read, and where reading goes on from (when known)."""
        skipped = sum(self.reader.skipped.values())
        self.result.skipped += skipped - self.skipped
        if self.reader.position is not None:
            _, before = self.store.position(self.stream)
            self.store.set_position(self.stream, self.reader.position, before + skipped - self.skipped)
        self.skipped = skipped
        self.store.commit()
        self.unsaved = 0


def _read(connection: Any, store: IndexStore, stream: str, first: Union[str, datetime], result: SyncResult, *,
          clock: Callable[[], float], timeout: float, notices: Notices) -> None:
    reader = StreamReader(stream, start=first, clock=clock, timeout=timeout, notices=notices)
    reader.position = store.position(stream)[0]
    apply = _Apply(stream, store, result, reader)
    try:
        reader.read_to_end(connection, on_record=apply, on_reset=apply.reset)
    except NotReadToEnd as exc:
        raise IndexUnavailable(f"{exc} ({result.records} record(s) read; run the sync again to go on from "
                               f"there)") from None
    except ReadError as exc:
        raise IndexUnavailable(str(exc)) from None
    finally:
        apply.save()
        store.commit()


def cancellations_from(store: IndexStore, now: float) -> datetime:
    """Where a first read of ``ladder.cancellations`` starts: the records that can still drop a message (a
    relay's window), or, when earlier, the records written since the oldest entry the index holds was
    published (less the slack): an older one cannot name it, a later one may, however old it is now."""
    window = read_from(now)
    oldest = store.oldest()
    if oldest is None:
        return window
    since = datetime.fromtimestamp(max(0, oldest - SLACK) // 1000, tz=timezone.utc)
    return min(window, since)


def sync(connection: Any, store: IndexStore, *, timeout: float = SYNC_TIMEOUT,
         clock: Optional[Callable[[], float]] = None) -> SyncResult:
    """Read ``ladder.index`` (from its start the first time) and ``ladder.cancellations`` (the first time from
    the records that can still cancel anything, or that may name an entry: see :func:`cancellations_from`)
    into ``store``, from where the last sync stopped, up to a marker this
    sync appends to each: everything written before the sync began is read. Then forget entries due over
    a day ago.

    Records are untrusted: an invalid one is skipped, counted and logged (a few lines per ten seconds).
    What was read is committed every :data:`COMMIT_EVERY` records with the offset it reached, so an
    interrupted sync goes on from there.

    Raises:
        IndexUnavailable: a stream was not read to its end within ``timeout`` seconds.
    """
    clock = clock_of(connection, clock)
    started = time.monotonic()
    result = SyncResult()
    notices = Notices(logger)
    now_ms = int(clock() * 1000)
    declare_control_plane_if_allowed(connection)
    for stream in (INDEX, CANCELLATIONS):
        first = "first" if stream == INDEX else cancellations_from(store, clock())
        bulk = stream == INDEX and store.position(stream)[0] is None and not len(store)
        with store.loading() if bulk else nullcontext():
            _read(connection, store, stream, first, result, clock=clock, timeout=timeout, notices=notices)
    result.pruned = store.prune(now_ms)
    notices.flush()
    result.seconds = time.monotonic() - started
    return result
