"""Console: what the web pages read and do, over the index, the sampler and the ladder's operations.

The only module of the console that talks to the broker or the index file. It keeps
broker traffic independent of how many people watch: queue depths come from one
:class:`~kombu_ladder.sampler.QueueSampler`, the index is read and relay counters are
polled by one thread every ``refresh`` seconds, and what a page looks at in the queues
(a message's headers, the parked messages) is kept for ``refresh`` seconds.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from ..cancellation.records import STREAM as CANCELLATIONS
from ..cancellation.stream import cancel_many
from ..carry import bytes_of
from ..contract import CONTROL
from ..depths import QueueDepth
from ..index import Filter, IndexStore, IndexUnavailable, Row, ids_of, sync
from ..link import clock_of
from ..parking import Parked, discard, parked_messages, replay
from ..peek import find, live_cancellations, state_of
from ..rescheduling import RESCHEDULED_QUEUES, reschedule
from ..sampler import QueueSampler
from .options import ConsoleOptions
from .views import Outcome, iso, relay_counters, rung_for

__all__ = ["Console", "Seen", "Look", "IndexState", "Counters", "scrape_relays"]

logger = logging.getLogger("kombu_ladder.web")

W_SYNC = "could not read the index from the broker (%s); the console shows what it read before"
W_COUNTERS = "could not poll the relays' counters (%s)"

#: Reads the relays' counters: ``{relay name: {counter: value}}`` (``celery inspect ladder``'s answer).
Counters = Callable[[], Mapping[str, Mapping[str, Any]]]

#: Actions remembered for the Actions page.
RECENT = 50


def scrape_relays(urls: Sequence[str], *, timeout: float = 2.0) -> dict[str, dict[str, Any]]:
    """Each standalone relay's counters, read from its ``/metrics`` URL (``kombu-ladder relay --metrics-port``):
    ``{url: counters}``, or ``{url: {"error": why}}`` for one that did not answer."""
    out: dict[str, dict[str, Any]] = {}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - the operator's own URL
                out[url] = relay_counters(answer.read(1 << 20).decode("utf-8", "replace"))
        except (OSError, ValueError) as exc:
            out[url] = {"error": str(exc) or type(exc).__name__}
    return out


@dataclass(frozen=True)
class Seen:
    """A waiting message as found in its queue: where, and its headers, properties and body (untrusted)."""

    queue: str
    position: int
    depth: int
    headers: Mapping[str, Any]
    properties: Mapping[str, Any]
    body: bytes


@dataclass(frozen=True)
class Look:
    """What looking for one message in the queues gave: not done yet, found (``seen``), not found, or an error."""

    done: bool
    seen: Optional[Seen] = None
    looked_at: int = 0
    seconds: float = 0.0
    error: Optional[str] = None
    #: Its state as a relay would decide now: waiting, cancelled or parked (see :func:`~kombu_ladder.peek.state_of`).
    state: Optional[str] = None


@dataclass
class IndexState:
    """How up to date the index the pages read is."""

    path: str
    #: When the last read of the streams finished (epoch s), and what it read.
    synced_at: Optional[float] = None
    entries_read: int = 0
    #: Why the last read failed (None: it did not).
    error: Optional[str] = None


@dataclass
class _Kept:
    """A value looked up in the queues, kept for a while."""

    at: float
    value: Any = field(default=None)


class Console:
    """The console's view of one broker (``connection``: a :class:`kombu.Connection`, cloned for each use).

    Arguments:
        connection: the broker.
        options: the console's options.
        index_path: the index file (see :func:`~kombu_ladder.index.default_path`).
        counters: reads the relays' counters, or None when they cannot be reached (``kombu-ladder web``).
        clock: epoch seconds (default: the broker's: the simulator's virtual clock, else the wall clock).
        sampler: the queue-depth sampler (default: one of its own on a clone of ``connection``).
    """

    def __init__(self, connection: Any, *, options: ConsoleOptions, index_path: str,
                 counters: Optional[Counters] = None, clock: Optional[Callable[[], float]] = None,
                 sampler: Optional[QueueSampler] = None) -> None:
        self.connection = connection
        self.options = options
        self.clock = clock_of(connection, clock)
        self.index = IndexState(index_path)
        self.sampler = sampler or QueueSampler(connection.clone(), interval=options.refresh, clock=self.clock)
        self.counters_source = counters
        #: The last counters polled (None: not polled, or not reachable) and why polling failed.
        self.counters: Optional[Mapping[str, Mapping[str, Any]]] = None
        self.counters_error: Optional[str] = None
        #: What this console did, newest first.
        self.recent: collections.deque[Outcome] = collections.deque(maxlen=RECENT)
        #: New due times of messages this console moved (until the index has read them): id -> epoch ms.
        self.moved: dict[str, int] = {}
        self._local = threading.local()
        self._acting = threading.Lock()
        self._looks = threading.Lock()
        self._looked: dict[str, _Kept] = {}
        self._looking: dict[str, Future[Look]] = {}
        #: One look into the queues at a time, however many pages ask.
        self._looker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ladder-console-look")
        self._parked: Optional[_Kept] = None
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._sync_connection: Any = None

    # -- running -----------------------------------------------------------------------

    def start(self) -> "Console":
        """Start the sampler and the thread that reads the index and polls the counters."""
        self.sampler.start()
        self._thread = threading.Thread(target=self._run, name="ladder-console-refresh", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and reading; close the connections."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.sampler.stop()
        self._looker.shutdown(wait=False, cancel_futures=True)
        self._close_sync()

    def _run(self) -> None:
        store = IndexStore(self.index.path)
        try:
            while not self._stopped.is_set():
                self.refresh(store)
                self._stopped.wait(self.options.refresh)
        finally:
            store.close()

    def refresh(self, store: IndexStore) -> None:
        """Read what is new in the index into ``store``, and poll the counters (the thread's loop; never raises)."""
        try:
            if self._sync_connection is None:
                self._sync_connection = self.connection.clone()
                self._sync_connection.ensure_connection(max_retries=1)
            result = sync(self._sync_connection, store, timeout=max(60.0, self.options.refresh * 10), clock=self.clock)
            self.index.synced_at, self.index.entries_read, self.index.error = self.clock(), result.entries, None
        except (IndexUnavailable, Exception) as exc:  # noqa: BLE001 - shown on the pages, retried next time
            if self.index.error is None:
                logger.warning(W_SYNC, exc)
            self.index.error = str(exc) or type(exc).__name__
            self._close_sync()
        if self.counters_source is not None:
            try:
                self.counters, self.counters_error = dict(self.counters_source()), None
            except Exception as exc:  # noqa: BLE001 - shown on the overview
                if self.counters_error is None:
                    logger.warning(W_COUNTERS, exc)
                self.counters, self.counters_error = None, str(exc) or type(exc).__name__

    def _close_sync(self) -> None:
        if self._sync_connection is not None:
            try:
                self._sync_connection.close()
            except Exception:  # noqa: BLE001 - a dead connection
                logger.debug("closing the index connection failed", exc_info=True)
            self._sync_connection = None

    # -- reading -------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def store(self) -> IndexStore:
        """This thread's reader of the index file (SQLite connections stay in the thread that opened them)."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = IndexStore(self.index.path)
        return store

    def depths(self) -> tuple[tuple[QueueDepth, ...], Optional[float]]:
        """The sampler's last queue depths and when they were taken (empty, None: no sample yet, or it failed)."""
        return self.sampler.depths, self.sampler.sampled_at

    def listing(self, found: Filter, *, limit: int, offset: int) -> list[Row]:
        """A page of the waiting entries ``found`` covers, soonest due first."""
        return self.store().listing(found, self.now_ms(), limit=limit, offset=offset)

    def count(self, found: Filter) -> int:
        """How many waiting entries ``found`` covers."""
        return int(self.store().count(found, self.now_ms())[0][1])

    def find(self, ident: str) -> list[Row]:
        return self.store().find(ident, self.now_ms())

    def histogram(self, width_ms: int, buckets: int) -> tuple[list[int], int]:
        """Waiting entries per ``width_ms`` window from now (aligned to the window), and where the first starts."""
        now = self.now_ms()
        start = now // width_ms * width_ms
        return self.store().histogram(start, width_ms, buckets, now), start

    @contextmanager
    def _broker(self) -> Iterator[Any]:
        """A connection of its own for one look or action (kombu connections are not shared across threads)."""
        with self.connection.clone() as conn:
            conn.ensure_connection(max_retries=1)
            yield conn

    def _fresh(self, kept: Optional[_Kept]) -> bool:
        return kept is not None and time.monotonic() - kept.at < self.options.refresh

    def look(self, ident: str, due_ms: Optional[int] = None, *, wait: float = 0.0) -> Look:
        """The message ``ident`` as found in its queue, looked for in the background (one look at a time, whoever
        asks): wait up to ``wait`` seconds for it, else say it is still being looked for. A result is kept for
        ``refresh`` seconds."""
        with self._looks:
            kept = self._looked.get(ident)
            if kept is not None and self._fresh(kept):
                return kept.value
            future = self._looking.get(ident)
            if future is None:
                future = self._looking[ident] = self._looker.submit(self._look, ident, due_ms)
        try:
            return future.result(timeout=wait)
        except FutureTimeout:
            return Look(done=False)

    def _look(self, ident: str, due_ms: Optional[int]) -> Look:
        """Find ``ident`` in the rungs and the control queue (its rung first); every message stays in its place."""
        first = rung_for(due_ms, self.now_ms()) if due_ms is not None else None
        queues = tuple(sorted(RESCHEDULED_QUEUES, key=lambda q: q != first))
        captured: list[Any] = []
        started = time.monotonic()
        try:
            with self._broker() as conn:
                result = find(conn, ident, limit=self.options.look_limit, queues=queues,
                              take=lambda channel, message: captured.append(message))
                state = state_of(result.found[0], live_cancellations(conn), self.now_ms()) if result.found else None
        except Exception as exc:  # noqa: BLE001 - shown on the page; the next view looks again
            found = Look(done=True, error=str(exc) or type(exc).__name__)
        else:
            seen = None
            if result.found and captured:
                sighting, message = result.found[0], captured[0]
                seen = Seen(sighting.queue, sighting.position, sighting.depth, dict(message.headers or {}),
                            dict(getattr(message, "properties", None) or {}), bytes_of(message.body))
            found = Look(done=True, seen=seen, looked_at=result.looked_at, seconds=time.monotonic() - started,
                         state=state)
        with self._looks:
            if len(self._looked) > 1000:
                self._looked.clear()
            self._looked[ident] = _Kept(time.monotonic(), found)
            self._looking.pop(ident, None)
        return found

    def parked(self) -> list[Parked]:
        """The first ``parked_limit`` parked messages (looked at, not taken), kept for ``refresh`` seconds."""
        if self._parked is not None and self._fresh(self._parked):
            return list(self._parked.value)
        with self._broker() as conn:
            found = parked_messages(conn, limit=self.options.parked_limit)
        self._parked = _Kept(time.monotonic(), found)
        return list(found)

    # -- acting ----------------------------------------------------------------------------

    def record(self, outcome: Outcome) -> Outcome:
        """Remember what an action did (the Actions page), and forget what was looked at (it may have changed)."""
        self.recent.appendleft(outcome)
        with self._looks:
            self._looked.clear()
        self._parked = None
        return outcome

    def cancel(self, ident: str) -> Outcome:
        """Record a cancellation of ``ident`` (a message id or task id) and say what the broker confirmed."""
        rows = self.find(ident)
        waiting = [r for r in rows if r.state == "waiting"]
        key = "task_id" if any(r.entry.task_id == ident for r in rows) else "message_id"
        with self._acting, self._broker() as conn:
            recorded = cancel_many(conn, [ident], key=key)
        known = (f"the index knows it as waiting, due {iso(waiting[0].entry.due)}" if waiting else
                 "the index does not know it as waiting (not indexed, due already, or cancelled before)")
        return self.record(Outcome(
            True, f"Cancelled {ident}", (
                f"The broker confirmed {recorded} cancellation record(s) in {CANCELLATIONS} for {ident}.",
                f"Every relay drops the message with that id at its next hop or delivery; {known}."),
            at=self.now_ms(), action="cancel", details={"id": ident, "recorded": recorded}))

    def reschedule(self, ident: str, due_ms: int) -> Outcome:
        """Make ``ident`` due at ``due_ms`` (now or earlier: run it now); say where it was and what was committed."""
        now = self.now_ms()
        when: Any = 0.0 if due_ms <= now else datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc)
        action = "run now" if due_ms <= now else "reschedule"
        with self._acting, self._broker() as conn:
            moved = reschedule(conn, ident, when, limit=self.options.look_limit, clock=self.clock)
        if moved.found is None:
            more = f" (looked at the first {moved.looked_at})" if moved.truncated else ""
            return self.record(Outcome(
                False, f"Not found: {ident}", (
                    f"No waiting message with the id {ident} was found in the rungs or {CONTROL}{more}: nothing was "
                    "moved. It may be due already, held by a relay for its last seconds, or parked.",),
                at=now, action=action, details={"id": ident}))
        self.moved[ident] = moved.due_at
        return self.record(Outcome(
            True, f"{'Ran now' if action == 'run now' else 'Rescheduled'}: {ident}", (
                f"Found in {moved.found.queue} (position {moved.found.position} of {moved.found.depth}), "
                f"due {iso(moved.found.due_at)}.",
                f"The broker committed one transaction: a copy due {iso(moved.due_at)} went into {CONTROL} and "
                "the original was taken, so it is delivered once.",
                "The index shows the new time from its next read." if moved.indexed else
                "The index was not told (it is not in use here, or the broker refused the entry): it keeps the "
                "old time; this console remembers the new one."),
            at=now, action=action, details={"id": ident, "queue": moved.found.queue, "due_at": moved.due_at}))

    def bulk_rows(self, found: Filter) -> list[Row]:
        """Every waiting entry ``found`` covers (what a bulk cancel of it would touch)."""
        return self.store().listing(found, self.now_ms(), limit=-1)

    def bulk_cancel(self, found: Filter, *, expected: Optional[int] = None) -> Outcome:
        """Cancel every waiting message of the index that ``found`` covers."""
        by_task, by_message, unnamed = ids_of(self.bulk_rows(found))
        recorded = 0
        with self._acting, self._broker() as conn:
            if by_task:
                recorded += cancel_many(conn, by_task, key="task_id")
            if by_message:
                recorded += cancel_many(conn, by_message, key="message_id")
        lines = [f"The broker confirmed {recorded} cancellation record(s) in {CANCELLATIONS}: every relay drops "
                 "those messages at their next hop or delivery."]
        if expected is not None and expected != len(by_task) + len(by_message):
            lines.append(f"The preview showed {expected}; by the time of the confirmation the index held "
                         f"{len(by_task) + len(by_message)} (new messages, or some fell due).")
        if unnamed:
            lines.append(f"{unnamed} matching message(s) have no id and could not be cancelled.")
        return self.record(Outcome(True, f"Bulk cancel: {recorded} id(s)", tuple(lines), at=self.now_ms(),
                                  action="bulk cancel", details={"recorded": recorded}))

    def replay(self, *, parked_id: Optional[str] = None, reason: Optional[str] = None) -> Outcome:
        """Replay one parked message (``parked_id``) or every one parked for exactly ``reason``."""
        with self._acting, self._broker() as conn:
            result = replay(conn, ids=[parked_id] if parked_id is not None else None, reason=reason)
        what = f"the parked message {parked_id}" if parked_id is not None else "the group"
        ok = result.replayed > 0
        lines: tuple[str, ...] = (
            f"The broker confirmed {result.replayed} copy(ies) on {CONTROL}, each removed from parking once "
            f"confirmed; {result.kept} left parked.",
            "The relay decides about each again: delivered if due and deliverable, back into a rung if not due, "
            "parked again with a fresh reason if it still cannot be delivered.")
        if not ok:
            lines = (f"Nothing was replayed: {what} is no longer parked ({result.kept} other(s) left parked).",)
        return self.record(Outcome(ok, f"Replayed {result.replayed}", lines, at=self.now_ms(), action="replay",
                                   details={"replayed": result.replayed, "kept": result.kept}))

    def discard(self, parked_id: str) -> Outcome:
        """Delete one parked message."""
        with self._acting, self._broker() as conn:
            found = discard(conn, parked_id)
        line = (f"The broker took the parked message {parked_id} (acked): it is gone." if found else
                f"No parked message has the id {parked_id}: nothing was deleted.")
        return self.record(Outcome(found, "Deleted" if found else "Not found", (line,), at=self.now_ms(),
                                  action="delete parked", details={"parked_id": parked_id}))
