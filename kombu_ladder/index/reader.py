"""sync(): read ``ladder.index`` and ``ladder.cancellations`` from where the last sync stopped into an IndexStore."""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Union

from kombu import Consumer, Producer, Queue

from ..cancellation.records import SLACK, RecordError, read_from
from ..cancellation.records import STREAM as CANCELLATIONS
from ..cancellation.records import decode as decode_cancel
from ..cancellation.records import encode_marker as encode_cancel_marker
from ..controlplane import MARKER, accepts
from ..link import clock_of, close_quietly
from ..notices import Notices
from ..text import escape
from ..topology import declare_control_plane_if_allowed
from .records import STREAM as INDEX
from .records import IndexRecordError, decode, encode_marker
from .store import IndexStore

__all__ = ["sync", "SyncResult", "IndexUnavailable", "default_path", "INDEX_ENV", "SYNC_TIMEOUT"]

logger = logging.getLogger("kombu_ladder.index")

W_BAD_RECORD = "skipping a record in %s that is not one of ours: %s"
W_RESET = "%s is shorter than where the index read it to (deleted and declared again?): reading it from its start"

#: The environment variable that names the index file when ``--index`` is not given.
INDEX_ENV = "KOMBU_LADDER_INDEX"
#: Seconds a sync waits, at most, for a stream to be read to its end.
SYNC_TIMEOUT = 300.0
#: Records the broker may send at once; they are acked together every :data:`ACK_EVERY`.
PREFETCH = 2000
ACK_EVERY = PREFETCH // 4
#: Records read per SQLite transaction (and per remembered offset).
COMMIT_EVERY = 2000
#: Seconds between declares of a stream the broker does not serve yet (its node just restarted).
RETRY_EVERY = 0.5


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


class _StreamRead:
    """One stream read from an offset to the marker this reader appended to it."""

    def __init__(self, stream: str, store: IndexStore, result: SyncResult, notices: Notices,
                 handle: Callable[[bytes, str, Any], bool]) -> None:
        self.stream, self.store, self.result, self.notices, self.handle = stream, store, result, notices, handle
        self.token = uuid.uuid4().hex
        self.done = False
        self.reset = False
        #: The offset of the next record (None: unknown, when the broker sends none and the start was no offset).
        self.position: Optional[int] = None
        self.skipped = 0
        self.unsaved = 0
        self.taken = self.acked = 0
        self.channel: Any = None

    def on_message(self, message: Any) -> None:
        offset = (message.headers or {}).get("x-stream-offset")
        if isinstance(offset, int) and not isinstance(offset, bool):
            if self.position is not None and offset < self.position:
                self._skip_known(message, offset)
                return
            self.position = offset + 1
        elif self.position is not None:
            self.position += 1
        self.result.records += 1
        try:
            if self.handle(bytes(message.body) if not isinstance(message.body, str)
                           else message.body.encode("utf-8", "surrogatepass"), self.token,
                           (message.delivery_info or {}).get("exchange")):
                self.done = True
        except (IndexRecordError, RecordError) as exc:
            self.skipped += 1
            self.result.skipped += 1
            self.notices.warn(self.stream, W_BAD_RECORD, self.stream, escape(exc))
        self._took(message)

    def _skip_known(self, message: Any, offset: int) -> None:
        """A record before the offset asked for (RabbitMQ starts at the chunk holding it): read already. Unless it
        is this reader's marker: then the stream is shorter than the index thought."""
        body = message.body if isinstance(message.body, (bytes, str)) else bytes(message.body)
        if self.token in (body.decode("utf-8", "replace") if isinstance(body, bytes) else body):
            self.reset = self.done = True
        self._took(message)

    def _took(self, message: Any) -> None:
        self.taken = message.delivery_tag
        self.unsaved += 1
        if self.taken - self.acked >= ACK_EVERY or self.done:
            self.channel.basic_ack(self.taken, multiple=True)
            self.acked = self.taken

    def save(self) -> None:
        """Commit what was read, and where reading goes on from (when known)."""
        if self.position is not None:
            _, skipped = self.store.position(self.stream)
            self.store.set_position(self.stream, self.position, skipped + self.skipped)
            self.skipped = 0
        self.store.commit()
        self.store.begin()
        self.unsaved = 0


def _handle_index(store: IndexStore, result: SyncResult) -> Callable[[bytes, str, Any], bool]:
    def handle(body: bytes, token: str, exchange: Any) -> bool:
        batch = decode(body)
        if not accepts(batch.kind, exchange):
            raise IndexRecordError(f"a {batch.kind!r} record written through the exchange {exchange!r:.60}, "
                                   f"not its own")
        if batch.kind == "marker":
            return batch.token == token
        store.add(batch.entries)
        result.entries += len(batch.entries)
        return False

    return handle


def _handle_cancellations(store: IndexStore, result: SyncResult) -> Callable[[bytes, str, Any], bool]:
    def handle(body: bytes, token: str, exchange: Any) -> bool:
        record = decode_cancel(body)
        if not accepts(record.kind, exchange):
            raise RecordError(f"a {record.kind!r} record written through the exchange {exchange!r:.60}, not its own")
        if record.kind == "marker":
            return record.id == token
        store.cancel(record.id, record.at)
        result.cancellations += 1
        return False

    return handle


def _read(connection: Any, store: IndexStore, stream: str, first: Union[str, datetime], reading: _StreamRead,
          *, marker: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    known, _ = store.position(stream)
    start: Union[int, str, datetime] = first if known is None else known
    reading.position = known if known is not None else (0 if first == "first" else None)
    channel = _consuming(connection, stream, start, reading, deadline)
    store.begin()
    try:
        Producer(channel, auto_declare=False).publish(marker, exchange=MARKER.exchange, routing_key=stream,
                                                      content_type="application/json",
                                                      content_encoding="utf-8", delivery_mode=2)
        while not reading.done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise IndexUnavailable(f"{stream} was not read to its end within {timeout:g} s "
                                       f"({reading.result.records} record(s) read; run the sync again "
                                       f"to go on from there)")
            try:
                connection.drain_events(timeout=min(left, 1.0))
            except TimeoutError:  # socket.timeout is TimeoutError
                pass
            if reading.unsaved >= COMMIT_EVERY:
                reading.save()
        reading.save()
    finally:
        store.commit()
        close_quietly(channel)


def _consuming(connection: Any, stream: str, start: Union[int, str, datetime], reading: _StreamRead,
               deadline: float) -> Any:
    """A channel consuming ``stream`` from ``start`` into ``reading``. Nothing is declared (a reader has no
    configure on a control-plane name). Just after a broker restart a stream's node may not serve it yet
    (404, "home node ... is down"): it is tried again every :data:`RETRY_EVERY` s until ``deadline``."""
    while True:
        channel = reading.channel = connection.channel()
        try:
            channel.basic_qos(0, PREFETCH, False)
            Consumer(channel, [Queue(stream, no_declare=True, consumer_arguments={"x-stream-offset": start})],
                     on_message=reading.on_message, no_ack=False).consume()
            return channel
        except connection.channel_errors as exc:
            close_quietly(channel)
            if getattr(exc, "reply_code", None) != 404:
                raise
            text = getattr(exc, "reply_text", None) or exc
            if "home node" not in str(text):
                raise IndexUnavailable(f"{stream} does not exist ({text}): the operator's 'kombu-ladder declare' "
                                       f"declares it") from None
            if time.monotonic() >= deadline:
                raise IndexUnavailable(f"{stream} is not served by the broker yet ({text})") from None
        time.sleep(RETRY_EVERY)


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
    for stream, handle, marker in (
            (INDEX, _handle_index(store, result), encode_marker),
            (CANCELLATIONS, _handle_cancellations(store, result), encode_cancel_marker)):
        first = "first" if stream == INDEX else cancellations_from(store, clock())
        reading = _StreamRead(stream, store, result, notices, handle)
        bulk = stream == INDEX and store.position(stream)[0] is None and not len(store)
        with store.loading() if bulk else nullcontext():
            _read(connection, store, stream, first, reading, marker=marker(reading.token, at=now_ms),
                  timeout=timeout)
        if reading.reset:
            logger.warning(W_RESET, stream)
            store.forget(stream)
            reading = _StreamRead(stream, store, result, notices, handle)
            _read(connection, store, stream, first, reading, marker=marker(reading.token, at=now_ms),
                  timeout=timeout)
    result.pruned = store.prune(now_ms)
    notices.flush()
    result.seconds = time.monotonic() - started
    return result
