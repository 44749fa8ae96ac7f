"""CancelWatch: a relay's view of ``ladder.cancellations``, started from the newest complete snapshot."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Union

from .. import link, snapshots, wire
from ..cancellation.records import (
    CELERY_TASK_HEADER,
    READ_BACK_MS,
    STREAM,
    LiveSet,
    RecordError,
    cancelled_id,
    decode,
    encode_marker,
    read_from,
)
from ..carry import confirming
from ..controlplane import MARKER, READ_PREFETCH, READ_TIMEOUT, SEAL, SNAPSHOT, SNAPSHOTS, accepts
from ..link import CONNECTION_ERRORS
from ..notices import Notices
from ..snapshots import Part, Seal, SnapshotError
from ..text import escape
from ..topology import declare_control_plane_if_allowed

__all__ = ["CancelWatch", "CATCH_UP_TIMEOUT", "RECORD_PREFETCH", "READ_BACK_MS", "CELERY_TASK_HEADER", "cancelled_id",
           "read_from", "HOLD_AFTER_PARTS", "stream_offset"]

logger = logging.getLogger("kombu_ladder.relay")

I_CAUGHT_UP = "read %d live cancellation(s) from %s (%d record(s) since %s); relaying"
I_SNAPSHOT = "loaded snapshot %s of %s: %d live cancellation(s), up to offset %d of %s, sealed %.0f s ago"
I_NO_SNAPSHOT = "no complete snapshot in %s (looked back %.0f s); reading the cancellations of the last %.0f h"
W_NO_SNAPSHOTS = ("cannot read or write %s (%s): this relay reads the cancellations of the last %.0f h at each "
                  "start, and writes no snapshot")
I_WROTE = "wrote snapshot %s to %s: %d live cancellation(s) in %d part(s), up to offset %d of %s"
W_ABANDONED = "gave up writing snapshot %s to %s: %s; the next one is written later"
W_HOLDING = "holding snapshot %s unsealed after %d part(s) (%s is set)"
W_BAD_RECORD = "skipping a record in %s that is not a %s: %s"
E_NO_STREAM = ("cannot read the cancellations in %s (%s); relaying WITHOUT enforcing them: a cancelled "
               "message may be delivered")
W_SLOW = "%s was not read to its end within %.0f s; relaying meanwhile, later records still apply"

#: Unacked records the broker may send at once (a stream consumer needs a prefetch).
RECORD_PREFETCH = READ_PREFETCH
#: Records are acked together (``multiple``) once this many are unacked, and the rest at each tick:
#: a stream's acks only give credit, and one ack per record halved the reading speed.
ACK_EVERY = RECORD_PREFETCH // 4
#: Seconds (relay clock) a relay waits to read the stream to its end before relaying anyway.
CATCH_UP_TIMEOUT = READ_TIMEOUT
#: Unacked snapshot records the broker may send at once (parts are up to 256 KiB each).
SNAPSHOT_PREFETCH = 64
#: Parts of a snapshot published per tick (pipelined: confirms are not waited for in the tick).
PARTS_PER_TICK = 10
#: For tests: a relay publishes at most this many parts of a snapshot and never seals it, so that a test
#: can kill it in the middle of writing one. Unset: snapshots are written whole.
HOLD_AFTER_PARTS = "LADDER_SNAPSHOT_HOLD_AFTER_PARTS"
#: The header RabbitMQ delivers every stream record with: the record's offset.
OFFSET_HEADER = b"x-stream-offset"

#: Where a stream consumer starts: a numeric offset, a timestamp (whole seconds), or "next".
Offset = Union[int, datetime, str]


def stream_offset(raw: Optional[bytes]) -> Optional[int]:
    """The offset RabbitMQ gave a stream record (its ``x-stream-offset`` header), from its encoded properties."""
    if not raw:
        return None
    try:
        for name, item in wire.read_properties(raw).headers or ():
            if name == OFFSET_HEADER:
                value = wire.decode(item)
                return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
    except wire.WireError:
        return None
    return None


class _Writer:
    """One snapshot being written: its parts, then its seal, each publish confirmed before the next stage."""

    def __init__(self, parts: list[bytes], seal: bytes, info: Seal, entries: int, hold: Optional[int]) -> None:
        self.parts, self.seal, self.info, self.entries = parts, seal, info, entries
        #: Parts published so far; whether the seal was.
        self.sent = 0
        self.sealed = False
        #: Publish sequence numbers not yet confirmed, and why the snapshot failed (None: not failed).
        self.unconfirmed: set[int] = set()
        self.failed: Optional[str] = None
        self.hold = hold
        self.held = False


class CancelWatch:
    """Consumes ``ladder.cancellations`` on a channel of its own, starting from the newest complete snapshot.

    A first start reads the recent tail of ``ladder.snapshots`` (up to a marker of its own), loads the
    newest complete snapshot (:mod:`kombu_ladder.snapshots`) and reads the cancellations from the offset
    after the one it covers; without a snapshot (none yet, no snapshot stream, no right to read it), it
    reads the records of the last :data:`READ_BACK_MS`, as relays always did. Either way it appends a
    marker to the cancellations: once it comes back, every earlier record has been read, and
    :meth:`start`'s ``on_ready`` is called (the relay then consumes the control queue). A start after a
    reconnect resumes from the last record read (:attr:`position`): nothing is read twice or reloaded.
    While relaying, it writes a snapshot when the policy says (parts from :meth:`tick`, confirmed, then
    the seal), and keeps reading the snapshot stream to count other relays' seals as its own. Records are
    untrusted: a bad one is counted and skipped.
    """

    def __init__(self, *, clock: Callable[[], float], notices: Optional[Notices] = None,
                 policy: Optional[snapshots.Policy] = None) -> None:
        self.clock = clock
        #: The live cancelled ids: each is matched against a message's ``message_id``, and against the
        #: ``correlation_id`` of a Celery task message (its task id), whatever the record's ``key``.
        self.live = LiveSet()
        #: Where the per-record warnings go, rate-limited (the relay's, when it has them).
        self.notices = notices if notices is not None else Notices(logger)
        #: When snapshots are written (``LADDER_SNAPSHOT_*`` variables, else the defaults).
        self.policy = policy if policy is not None else snapshots.Policy.from_env(os.environ)
        #: Records skipped because they were not valid cancellations (or snapshot records).
        self.skipped = 0
        #: Records (cancellations and markers) read since the last start.
        self.read = 0
        #: Why the stream could not be read since the last start (None: read, or not started yet).
        self.unreadable: Optional[str] = None
        #: Why the snapshot stream could not be read or written (None: it can, or not tried yet).
        self.snapshots_unreadable: Optional[str] = None
        #: The offset of the last cancellation record read (None: none yet): a reconnect resumes after it.
        self.position: Optional[int] = None
        #: The offset of the last snapshot-stream record read (None: none yet).
        self.snapshot_position: Optional[int] = None
        #: The seal of the snapshot the first start loaded (None: it read back instead).
        self.loaded: Optional[Seal] = None
        #: Snapshots this relay wrote (sealed and confirmed).
        self.written = 0
        self._channel: Any = None
        self._guard: Any = None
        self._token = ""
        self._on_ready: Optional[Callable[[], None]] = None
        self._deadline = 0.0
        #: The last delivery tag taken, and the last acked, on the stream channel.
        self._taken = self._acked = 0
        self._since: Offset = "next"
        # -- the snapshot stream ------------------------------------------------------------------
        self._snap: Any = None
        self._snap_token = ""
        #: Whether a first start has not begun reading the cancellations yet (it is looking for a snapshot).
        self._cold = False
        self._windows: list[int] = []
        self._chooser = snapshots.Chooser()
        #: The newest complete snapshot known (read, or written by this relay), and when (relay ms) it was
        #: learnt or this relay last began one: the policy counts from both.
        self._known: Optional[Seal] = None
        self._known_ms: Optional[int] = None
        self._writer: Optional[_Writer] = None
        self._published = 0
        self._confirming = False
        hold = os.environ.get(HOLD_AFTER_PARTS)
        self._hold = int(hold) if hold and hold.isdigit() else None

    @property
    def enforcing(self) -> bool:
        """Whether the stream is being read (cancellations are enforced): started and not refused."""
        return self._channel is not None and self.unreadable is None

    @property
    def ready(self) -> bool:
        """Whether the stream was read to its end (or given up on) since the last start."""
        return self._on_ready is None

    def start(self, channel: Any, guard: Any, on_ready: Callable[[], None]) -> None:
        """Consume the stream on ``channel`` (a new one of the relay's connection); call ``on_ready`` once caught up."""
        self._channel, self._guard, self._on_ready = channel, guard, on_ready
        self._token = uuid.uuid4().hex
        self._deadline = self.clock() + CATCH_UP_TIMEOUT
        self._taken = self._acked = self.read = 0
        self.unreadable = None
        self._writer = None  # the old channel's publishes are lost with it; written again later
        guard.watch(channel, self._closed)  # properties stay raw bytes: only the body is read
        try:
            declare_control_plane_if_allowed(channel)  # full rights (a worker the README's way); else the operator's
            channel.basic_qos(0, RECORD_PREFETCH, False)
        except CONNECTION_ERRORS:
            if self._channel is None:
                return
            raise
        except Exception as exc:  # noqa: BLE001 - without the stream the relay still relays
            self._refused(exc)
            return
        if self.position is not None:  # a reconnect: resume, reload nothing
            self._consume(self.position + 1)
            self._open_snapshots(cold=False)
        else:
            self._open_snapshots(cold=True)  # then _consume, from the snapshot's offset or READ_BACK_MS ago

    def read_from(self) -> datetime:
        """Where a start without a snapshot reads from: :data:`READ_BACK_MS` ago (a timestamp, whole seconds)."""
        return read_from(self.clock())

    # -- the cancellations ----------------------------------------------------------------------

    def _consume(self, offset: Optional[Offset]) -> None:
        """Consume the cancellations from ``offset`` (None: :data:`READ_BACK_MS` ago), then append the marker."""
        self._cold = False
        channel = self._channel
        if channel is None or self._on_ready is None:
            return
        self._since = offset if offset is not None else self.read_from()
        try:
            channel.basic_consume(STREAM, callback=self._on_record, no_ack=False,
                                  arguments={"x-stream-offset": self._since})
            marker = encode_marker(self._token, at=int(self.clock() * 1000))
            link.publish(channel, link.RawMessage(marker, b"\x00\x00"), MARKER.exchange, STREAM)
        except CONNECTION_ERRORS:
            if self._channel is None:  # the broker closed the stream's channel (a 403, say): _closed said why
                return
            raise
        except Exception as exc:  # noqa: BLE001 - without the stream the relay still relays
            self._refused(exc)

    def _refused(self, exc: BaseException) -> None:
        self.unreadable = escape(exc)
        logger.error(E_NO_STREAM, STREAM, self.unreadable)
        self._ready()

    def _ready(self) -> None:
        on_ready, self._on_ready = self._on_ready, None
        if on_ready is not None:
            on_ready()

    def _closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        link.discard(self._channel)
        self._channel = None
        self.unreadable = f"the broker closed its channel: {code} {escape(text)}"
        logger.error(E_NO_STREAM, STREAM, self.unreadable)
        self._ready()

    def _on_record(self, message: Any) -> None:
        channel = self._channel
        try:
            raw = self._guard.take(channel) if self._guard is not None and channel is not None else None
            offset = stream_offset(raw)
            if offset is not None and (self.position is None or offset > self.position):
                self.position = offset
            self._read(bytes(message.body), message.delivery_info.get("exchange"))
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - no record stops the relay
            self.skipped += 1
            self.notices.warn("cancellation record", W_BAD_RECORD, STREAM, "cancellation",
                              f"{type(exc).__name__}: {escape(exc)}", level=logging.ERROR)
        self._taken = message.delivery_info["delivery_tag"]
        if self._taken - self._acked >= ACK_EVERY or self._on_ready is None:
            self._ack()

    def _ack(self) -> None:
        """Ack every record taken so far (one ``multiple`` ack)."""
        if self._channel is not None and self._taken > self._acked:
            self._channel.basic_ack(self._taken, multiple=True)
            self._acked = self._taken

    def _read(self, body: bytes, exchange: Any = None) -> None:
        self.read += 1
        try:
            record = decode(body)
            if not accepts(record.kind, exchange):
                raise RecordError(f"a {record.kind!r} record written through the exchange {exchange!r:.60}, "
                                  f"not its own")
        except RecordError as exc:
            self.skipped += 1
            self.notices.warn("cancellation record", W_BAD_RECORD, STREAM, "cancellation", escape(exc))
            return
        now = int(self.clock() * 1000)
        if record.kind == "cancel":
            self.live.add(record, now)
        elif record.id == self._token and self._on_ready is not None:
            self.live.prune(now, force=True)
            logger.info(I_CAUGHT_UP, len(self.live), STREAM, self.read, _where(self._since))
            self._ready()

    # -- the snapshot stream --------------------------------------------------------------------

    def _open_snapshots(self, *, cold: bool) -> None:
        """Open the snapshot channel (confirming); a cold start reads the recent tail for a snapshot first."""
        self._cold = cold
        if cold:
            self._windows = list(self.policy.windows_ms())
            self._chooser.forget()
        if self.snapshots_unreadable is not None:  # refused before: this relay reads back, as it did
            self._no_snapshots(self.snapshots_unreadable)
            return
        if not self._new_snapshot_channel():
            return
        if cold:
            self._next_window()
        else:
            self._consume_snapshots("next" if self.snapshot_position is None else self.snapshot_position + 1)

    def _new_snapshot_channel(self) -> bool:
        """Close the snapshot channel (with any records in flight to it) and open another; False if refused."""
        self._close_snapshots()
        try:
            channel = self._snap = link.sibling(self._channel)
            self._guard.watch(channel, self._snapshots_closed)
            channel.basic_qos(0, SNAPSHOT_PREFETCH, False)
            self._published, self._confirming = 0, False
        except CONNECTION_ERRORS:
            if self._snap is None:  # closed by the broker: _snapshots_closed went on
                return False
            raise
        except Exception as exc:  # noqa: BLE001 - without snapshots the relay reads back
            self._no_snapshots(escape(exc))
            return False
        return True

    def _next_window(self) -> None:
        window = self._windows.pop(0)
        self._snap_token = uuid.uuid4().hex
        start = datetime.fromtimestamp(max(0, int(self.clock() * 1000) - window) // 1000, tz=timezone.utc)
        if self._consume_snapshots(start):
            self._publish_snapshot_record(encode_marker(self._snap_token, at=int(self.clock() * 1000)),
                                          MARKER.exchange)

    def _consume_snapshots(self, offset: Offset) -> bool:
        channel = self._snap
        if channel is None:
            return False
        try:
            channel.basic_consume(SNAPSHOTS, callback=self._on_snapshot_record, no_ack=False,
                                  arguments={"x-stream-offset": offset})
        except CONNECTION_ERRORS:
            if self._snap is None:
                return False
            raise
        except Exception as exc:  # noqa: BLE001
            self._no_snapshots(escape(exc))
            return False
        return True

    def _publish_snapshot_record(self, body: bytes, exchange: str) -> int:
        """Publish ``body`` into the snapshot stream through ``exchange``; return its publish sequence number."""
        link.publish(self._snap, link.RawMessage(body, b"\x00\x00"), exchange, SNAPSHOTS)
        self._published += 1
        return self._published

    def _on_snapshot_record(self, message: Any) -> None:
        channel = self._snap
        try:
            raw = self._guard.take(channel) if self._guard is not None and channel is not None else None
            offset = stream_offset(raw)
            if offset is not None:
                self.snapshot_position = offset
            self._read_snapshot_record(bytes(message.body), message.delivery_info.get("exchange"))
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - no record stops the relay
            self.skipped += 1
            self.notices.warn("snapshot record", W_BAD_RECORD, SNAPSHOTS, "snapshot record",
                              f"{type(exc).__name__}: {escape(exc)}", level=logging.ERROR)
        if self._snap is not None and self._snap is channel:
            channel.basic_ack(message.delivery_info["delivery_tag"], multiple=True)

    def _read_snapshot_record(self, body: bytes, exchange: Any) -> None:
        try:
            if exchange == MARKER.exchange:
                marker = decode(body)
                if marker.kind == MARKER.name and marker.id == self._snap_token and self._snap_token:
                    self._snap_token = ""
                    self._snapshots_read()
                return
            record = snapshots.decode(body)
            kind = SNAPSHOT if isinstance(record, Part) else SEAL
            if exchange != kind.exchange:
                raise SnapshotError(f"a {kind.name!r} record written through the exchange {exchange!r:.60}, "
                                    f"not its own")
        except (RecordError, SnapshotError) as exc:
            self.skipped += 1
            self.notices.warn("snapshot record", W_BAD_RECORD, SNAPSHOTS, "snapshot record", escape(exc))
            return
        complete = self._chooser.add(record)
        if complete is not None:
            self._learn(complete.seal)

    def _learn(self, seal: Seal) -> None:
        """A complete snapshot was read or written: the policy counts from it if it is the newest known."""
        if self._known is None or seal.covers > self._known.covers:
            self._known = seal
            self._known_ms = int(self.clock() * 1000)

    def _snapshots_read(self) -> None:
        """A cold start read the snapshot stream up to its marker: load the newest complete snapshot, or look
        further back, or read the cancellations back."""
        newest = self._chooser.newest
        if newest is not None:
            now = int(self.clock() * 1000)
            kept = self.live.restore(newest.entries, now)
            self.loaded = newest.seal
            self._chooser.newest = snapshots.Snapshot(newest.seal, ())  # its entries are in the LiveSet now
            logger.info(I_SNAPSHOT, newest.seal.snapshot, SNAPSHOTS, kept, newest.seal.covers, STREAM,
                        max(0.0, (now - newest.seal.at) / 1000))
            self._consume(newest.seal.covers + 1)
            return
        if self._windows:  # a fresh channel: the old consumer's records in flight are dropped with it
            if self._new_snapshot_channel():
                self._chooser.forget()
                self._next_window()
            return
        logger.info(I_NO_SNAPSHOT, SNAPSHOTS, max(self.policy.windows_ms()) / 1000, READ_BACK_MS / 3_600_000)
        self._consume(None)

    def _no_snapshots(self, why: str) -> None:
        first = self.snapshots_unreadable is None
        self.snapshots_unreadable = why
        self._writer = None
        if first:
            logger.warning(W_NO_SNAPSHOTS, SNAPSHOTS, why, READ_BACK_MS / 3_600_000)
        self._snap_token = ""
        if self._cold:
            self._consume(None)

    def _snapshots_closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        link.discard(self._snap)
        self._snap = None
        self._no_snapshots(f"the broker closed its channel: {code} {escape(text)}")

    def _close_snapshots(self) -> None:
        channel, self._snap = self._snap, None
        if channel is None:
            return
        if self._guard is not None:
            self._guard.unwatch(channel)
        link.close_quietly(channel)

    # -- writing snapshots ----------------------------------------------------------------------

    def _confirmed(self, tag: int, multiple: bool) -> None:
        writer = self._writer
        if writer is not None:
            writer.unconfirmed = {seq for seq in writer.unconfirmed if seq > tag} if multiple \
                else writer.unconfirmed - {tag}

    def _refused_publish(self, tag: int, multiple: bool) -> None:
        writer = self._writer
        if writer is not None and any(seq == tag or (multiple and seq <= tag) for seq in writer.unconfirmed):
            writer.failed = f"the broker nacked a record (publish {tag})"

    def _write(self) -> None:
        """Begin a snapshot when the policy says, or carry on with the one being written (from :meth:`tick`)."""
        if self._snap is None or not self.ready or not self.enforcing or self._snap_token:
            return
        writer = self._writer
        if writer is None:
            self._begin()
            return
        if writer.failed is not None:
            logger.warning(W_ABANDONED, writer.info.snapshot, SNAPSHOTS, writer.failed)
            self._writer = None
            return
        if writer.sent < len(writer.parts):
            stop = len(writer.parts) if writer.hold is None else min(writer.hold, len(writer.parts))
            for body in writer.parts[writer.sent:min(stop, writer.sent + PARTS_PER_TICK)]:
                writer.unconfirmed.add(self._publish_snapshot_record(body, SNAPSHOT.exchange))
                writer.sent += 1
            if writer.sent < len(writer.parts) or writer.unconfirmed:
                if writer.sent == stop and not writer.unconfirmed and not writer.held:
                    writer.held = True
                    logger.warning(W_HOLDING, writer.info.snapshot, writer.sent, HOLD_AFTER_PARTS)
                return
        if writer.unconfirmed:
            return
        if not writer.sealed:
            writer.unconfirmed.add(self._publish_snapshot_record(writer.seal, SEAL.exchange))
            writer.sealed = True
            return
        self._writer = None
        self.written += 1
        self._learn(writer.info)
        logger.info(I_WROTE, writer.info.snapshot, SNAPSHOTS, writer.entries, len(writer.parts), writer.info.covers,
                    STREAM)

    def _begin(self) -> None:
        if self.position is None:
            return
        now = int(self.clock() * 1000)
        known = self._known
        records = None if known is None else self.position - known.covers
        since = None if self._known_ms is None else now - self._known_ms
        if not self.policy.due(records=records, since_ms=since):
            return
        self._known_ms = now  # an attempt counts for the spacing, whatever becomes of it
        self.live.prune(now, force=True)
        entries = self.live.entries()
        snapshot = uuid.uuid4().hex
        parts, seal = snapshots.encode(snapshot, entries, covers=self.position, at=now,
                                       part_entries=self.policy.part_entries)
        if not self._confirming:  # only now: a start's channels close with no confirm on its way
            confirming(self._snap, on_ack=self._confirmed, on_nack=self._refused_publish)
            self._published, self._confirming = 0, True
        hold = self._hold if self._hold is not None and self._hold < len(parts) else None
        self._writer = _Writer(parts, seal, Seal(snapshot, len(parts), self.position, now), len(entries), hold)

    # -- the relay's calls ----------------------------------------------------------------------

    def stop_waiting(self) -> None:
        """Never call :meth:`start`'s ``on_ready`` (the relay is stopping)."""
        self._on_ready = None

    def tick(self) -> None:
        """Write snapshots; give up waiting for the stream's end after :data:`CATCH_UP_TIMEOUT` (and relay)."""
        self._ack()  # none left unacked for long: RabbitMQ's consumer_timeout applies to streams too
        self.notices.flush()
        if self._on_ready is not None and self.clock() >= self._deadline:
            logger.warning(W_SLOW, STREAM, CATCH_UP_TIMEOUT)
            self._ready()
        try:
            self._write()
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - a snapshot is an optimisation: relaying goes on
            if self._writer is not None:
                logger.warning(W_ABANDONED, self._writer.info.snapshot, SNAPSHOTS, escape(exc))
            self._writer = None

    def cancelled(self, message_id: Any, correlation_id: Any = None,
                  headers: Optional[Mapping[str, Any]] = None) -> Optional[str]:
        """The id under which a message with these properties (bytes as on the wire) is cancelled, or None.

        An id matches the message's ``message_id``, or, on a Celery task message (one with a ``task``
        header), its ``correlation_id`` (the task id); and only if the message was waiting when the
        cancellation was written (see :meth:`~kombu_ladder.cancellation.records.LiveSet.cancelled`): when it entered
        its rung is read from ``headers`` (the message's ``x-death``).
        """
        if not len(self.live):
            return None
        now = int(self.clock() * 1000)
        self.live.prune(now)
        return cancelled_id(self.live, now, message_id, correlation_id, headers)

    def close(self) -> None:
        """Close the stream channels."""
        self._close_snapshots()
        if self._guard is not None and self._channel is not None:
            self._guard.unwatch(self._channel)
        link.close_quietly(self._channel)
        self._channel = None
        self._on_ready = None
        self._writer = None


def _where(offset: Offset) -> str:
    """An offset as a log shows it."""
    return f"offset {offset}" if isinstance(offset, int) else str(offset)
