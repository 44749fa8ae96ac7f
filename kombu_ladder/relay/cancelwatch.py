"""CancelWatch: a relay's view of ``ladder.cancellations``, started from the newest complete snapshot."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from functools import partial
from typing import Any, Callable, Optional

from .. import link
from ..cancellation.records import CELERY_TASK_HEADER, READ_BACK_MS, STREAM, LiveSet, cancelled_id, read_from
from ..carry import confirming
from ..controlplane import READ_PREFETCH, READ_TIMEOUT, SEAL, SNAPSHOT, SNAPSHOTS, snapshots
from ..controlplane.codec import Cancel, Part, RecordError, Seal
from ..controlplane.codec import encode as encode_record
from ..controlplane.reader import Offset, StreamReader
from ..link import CONNECTION_ERRORS
from ..notices import Notices
from ..text import escape
from ..topology import declare_control_plane_if_allowed

__all__ = ["CancelWatch", "CATCH_UP_TIMEOUT", "RECORD_PREFETCH", "READ_BACK_MS", "CELERY_TASK_HEADER", "cancelled_id",
           "read_from", "HOLD_AFTER_PARTS"]

logger = logging.getLogger("kombu_ladder.relay")

I_CAUGHT_UP = "read %d live cancellation(s) from %s (%d record(s) from %s); relaying"
I_SNAPSHOT = "loaded snapshot %s of %s: %d live cancellation(s), up to offset %d of %s, sealed %.0f s ago"
I_NO_SNAPSHOT = "no complete snapshot in %s (looked back %.0f s); reading the cancellations of the last %.0f h"
W_NO_SNAPSHOTS = ("cannot read or write %s (%s): this relay reads the cancellations of the last %.0f h at each "
                  "start, and writes no snapshot")
I_WROTE = "wrote snapshot %s to %s: %d live cancellation(s) in %d part(s), up to offset %d of %s"
W_ABANDONED = "gave up writing snapshot %s to %s: %s; the next one is written later"
W_HOLDING = "holding snapshot %s unsealed after %d part(s) (%s is set)"
W_RESET = "%s was declared again: forgetting its %d live cancellation(s) and the snapshots of the old one"
E_NO_STREAM = ("cannot read the cancellations in %s (%s); relaying WITHOUT enforcing them: a cancelled "
               "message may be delivered")

#: Unacked records the broker may send at once (a stream consumer needs a prefetch).
RECORD_PREFETCH = READ_PREFETCH
#: Seconds (relay clock) a relay waits to read the stream to its end before relaying anyway.
CATCH_UP_TIMEOUT = READ_TIMEOUT
#: Unacked snapshot records the broker may send at once (parts are up to 256 KiB each).
SNAPSHOT_PREFETCH = 64
#: Parts of a snapshot published per tick (pipelined: confirms are not waited for in the tick).
PARTS_PER_TICK = 10
#: For tests: a relay publishes at most this many parts of a snapshot and never seals it, so that a test
#: can kill it in the middle of writing one. Unset: snapshots are written whole.
HOLD_AFTER_PARTS = "LADDER_SNAPSHOT_HOLD_AFTER_PARTS"


class _Writer:
    """One snapshot being written: its parts, then its seal, each publish confirmed before the next stage."""

    def __init__(self, parts: list[bytes], seal: Seal, entries: int, hold: Optional[int]) -> None:
        self.parts, self.info, self.entries = parts, seal, entries
        #: Parts published so far; whether the seal was.
        self.sent = 0
        self.sealed = False
        #: Publish sequence numbers not yet confirmed, and why the snapshot failed (None: not failed).
        self.unconfirmed: set[int] = set()
        self.failed: Optional[str] = None
        self.hold = hold
        self.held = False


class CancelWatch:
    """Reads ``ladder.cancellations`` on a channel of its own, starting from the newest complete snapshot.

    A first start reads the recent tail of ``ladder.snapshots`` (up to a marker of its own), loads the
    newest complete snapshot (:mod:`kombu_ladder.controlplane.snapshots`) and reads the cancellations from
    the offset after the one it covers; without a snapshot (none yet, no snapshot stream, no right to read
    it), it reads the records of the last :data:`READ_BACK_MS`, as relays always did. Either way the
    reader (:class:`~kombu_ladder.controlplane.reader.StreamReader`) appends a marker to the cancellations:
    once it comes back, every earlier record has been read, and :meth:`start`'s ``on_ready`` is called
    (the relay then consumes the control queue). A start after a reconnect goes on from the last record
    read: nothing is read twice or reloaded. While relaying, it writes a snapshot when its policy says
    (parts from :meth:`tick`, confirmed, then the seal), and keeps reading the snapshot stream to count
    other relays' seals as its own. Records are untrusted: a bad one is counted and skipped.
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
        #: The reader of the cancellations: a first start without a snapshot reads from READ_BACK_MS ago.
        self.cancellations = StreamReader(STREAM, start=lambda: read_from(self.clock()), clock=self._now,
                                          timer=self._now, timeout=CATCH_UP_TIMEOUT, prefetch=RECORD_PREFETCH,
                                          notices=self.notices)
        #: The reader of the snapshot stream (a first start gives it a window; a reconnect goes on).
        self.snapshots = StreamReader(SNAPSHOTS, start="next", clock=self._now, timer=self._now,
                                      timeout=CATCH_UP_TIMEOUT, prefetch=SNAPSHOT_PREFETCH, notices=self.notices)
        #: Why the stream could not be read since the last start (None: read, or not started yet).
        self.unreadable: Optional[str] = None
        #: Why the snapshot stream could not be read or written (None: it can, or not tried yet).
        self.snapshots_unreadable: Optional[str] = None
        #: The seal of the snapshot the first start loaded (None: it read back instead, or the stream it was of
        #: has since been deleted and declared again).
        self.loaded: Optional[Seal] = None
        #: Snapshots this relay wrote (sealed and confirmed).
        self.written = 0
        self._channel: Any = None
        self._guard: Any = None
        self._on_ready: Optional[Callable[[], None]] = None
        #: The records read when the last start began, and where it read from.
        self._read_at_start = 0
        self._since: Any = None
        # -- the snapshot stream ------------------------------------------------------------------
        #: Whether a first start has not begun reading the cancellations yet (it is looking for a snapshot).
        self._cold = False
        self._windows: list[int] = []
        self._chooser = snapshots.Chooser()
        #: The newest complete snapshot known (read, or written by this relay), and when (relay ms) it was
        #: learnt or this relay last began one: the policy counts from both.
        self._known: Optional[Seal] = None
        self._known_ms: Optional[int] = None
        self._writer: Optional[_Writer] = None
        #: The channel snapshots are written on (confirming; opened at the first one), and its publishes.
        self._out: Any = None
        self._published = 0
        hold = os.environ.get(HOLD_AFTER_PARTS)
        self._hold = int(hold) if hold and hold.isdigit() else None

    def _now(self) -> float:
        return self.clock()

    @property
    def skipped(self) -> int:
        """Records skipped (not valid, or not through their kind's exchange) in both streams."""
        return sum(self.cancellations.skipped.values()) + sum(self.snapshots.skipped.values())

    @property
    def position(self) -> Optional[int]:
        """The offset of the last cancellation record read (None: none yet); a snapshot written now covers it."""
        position = self.cancellations.position
        return None if position is None or position < 1 else position - 1

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
        self.unreadable = None
        self._abandon_writing()  # the old channel's publishes are lost with it; written again later
        guard.watch(channel, self._closed)  # properties stay raw bytes: only the body is read
        try:
            declare_control_plane_if_allowed(channel)  # full rights (a worker the README's way); else the operator's
        except CONNECTION_ERRORS:
            if self._channel is None:
                return
            raise
        except Exception as exc:  # noqa: BLE001 - without the stream the relay still relays
            self._refused(exc)
            return
        if self.cancellations.position is not None:  # a reconnect: go on, reload nothing
            self._consume(None)
            self._open_snapshots(cold=False)
        else:
            self._open_snapshots(cold=True)  # then _consume, from the snapshot's offset or READ_BACK_MS ago

    def read_from(self) -> datetime:
        """Where a start without a snapshot reads from: :data:`READ_BACK_MS` ago (a timestamp, whole seconds)."""
        return read_from(self.clock())

    # -- the cancellations ----------------------------------------------------------------------

    def _consume(self, offset: Optional[Offset]) -> None:
        """Read the cancellations from ``offset`` (None: where the last start got to, else READ_BACK_MS ago)."""
        self._cold = False
        channel = self._channel
        if channel is None or self._on_ready is None:
            return
        self._read_at_start = self.cancellations.read
        reader = self.cancellations
        self._since = offset if offset is not None else (
            reader.position if reader.position is not None else self.read_from())
        try:
            reader.start(channel, offset=offset, on_record=self._on_cancel, on_caught_up=self._caught_up,
                         on_reset=self._reset, take_raw=self._guard.take)
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
        self.cancellations.forget_channel()
        self._channel = None
        self.unreadable = f"the broker closed its channel: {code} {escape(text)}"
        logger.error(E_NO_STREAM, STREAM, self.unreadable)
        self._ready()

    def _on_cancel(self, record: Any, offset: Optional[int]) -> None:
        if not isinstance(record, Cancel):
            raise RecordError(f"a {type(record).__name__} record is no cancellation")
        now = int(self.clock() * 1000)
        for cancellation in record.each():
            self.live.add(cancellation, now)

    def _caught_up(self) -> None:
        if self._on_ready is None:
            return
        self.live.prune(int(self.clock() * 1000), force=True)
        logger.info(I_CAUGHT_UP, len(self.live), STREAM, self.cancellations.read - self._read_at_start,
                    _where(self._since))
        self._ready()

    def _reset(self) -> None:
        """The cancellation stream was deleted and declared again: what was read from the old one is gone."""
        logger.warning(W_RESET, STREAM, len(self.live))
        self.live = LiveSet()
        self.loaded = self._known = self._known_ms = None  # a snapshot loaded was of the old stream
        self._abandon_writing()

    # -- the snapshot stream --------------------------------------------------------------------

    def _open_snapshots(self, *, cold: bool) -> None:
        """Read the snapshot stream; a cold start reads its recent tail for a snapshot first."""
        self._cold = cold
        if cold:
            self._windows = list(self.policy.windows_ms())
            self._chooser.forget()
        if self.snapshots_unreadable is not None:  # refused before: this relay reads back, as it did
            self._no_snapshots(self.snapshots_unreadable)
            return
        if cold:
            self._next_window()
        else:
            self._read_snapshots(None)

    def _next_window(self) -> None:
        window = self._windows.pop(0)
        start = datetime.fromtimestamp(max(0, int(self.clock() * 1000) - window) // 1000, tz=timezone.utc)
        self._chooser.forget()
        self._read_snapshots(start)

    def _read_snapshots(self, offset: Optional[Offset]) -> None:
        """Read the snapshot stream on a new channel (the old one closed, with any records on their way to it)."""
        self._close_snapshots()
        reader = self.snapshots
        if offset is not None:  # a window of a first start: read it all, whatever an earlier window read
            reader.position = None
        try:
            channel = link.sibling(self._channel)
            self._guard.watch(channel, self._snapshots_closed)
            reader.start(channel, offset=offset, on_record=self._on_snapshot_record,
                         on_caught_up=self._snapshots_read if offset is not None else None,
                         take_raw=self._guard.take)
        except CONNECTION_ERRORS:
            if not reader.reading:  # closed by the broker (404: no snapshot stream; 403): _snapshots_closed went on
                return
            raise
        except Exception as exc:  # noqa: BLE001 - without snapshots the relay reads back
            self._no_snapshots(escape(exc))

    def _on_snapshot_record(self, record: Any, offset: Optional[int]) -> None:
        if not isinstance(record, (Part, Seal)):
            raise RecordError(f"a {type(record).__name__} record is no snapshot record")
        complete = self._chooser.add(record)
        if complete is not None:
            self._learn(complete.seal)

    def _learn(self, seal: Seal) -> None:
        """A complete snapshot was read or written: the policy counts from it if it is the newest known."""
        if self._known is None or seal.covers > self._known.covers:
            self._known = seal
            sealed = min(seal.at, int(self.clock() * 1000))  # the writer's clock, never ahead of ours
            self._known_ms = sealed if self._known_ms is None else max(self._known_ms, sealed)

    def _snapshots_read(self) -> None:
        """A cold start read the snapshot stream to its marker: load the newest complete snapshot, or look
        further back, or read the cancellations back."""
        if not self._cold:
            return
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
        if self._windows:
            self._next_window()
            return
        logger.info(I_NO_SNAPSHOT, SNAPSHOTS, max(self.policy.windows_ms()) / 1000, READ_BACK_MS / 3_600_000)
        self._consume(None)

    def _no_snapshots(self, why: str) -> None:
        first = self.snapshots_unreadable is None
        self.snapshots_unreadable = why
        self._abandon_writing()
        if first:
            logger.warning(W_NO_SNAPSHOTS, SNAPSHOTS, why, READ_BACK_MS / 3_600_000)
        if self._cold:
            self._consume(None)

    def _snapshots_closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        channel = self.snapshots.forget_channel()
        if channel is not None:  # answer close-ok: a wait for a reply on it (consume-ok) then ends, as it must
            link.discard(channel)
        self._no_snapshots(f"the broker closed its channel: {code} {escape(text)}")

    def _close_snapshots(self) -> None:
        channel = getattr(self.snapshots, "_channel", None)
        if channel is not None and self._guard is not None:
            self._guard.unwatch(channel)
        self.snapshots.close()

    # -- writing snapshots ----------------------------------------------------------------------

    def _open_out(self) -> bool:
        """Open the confirming channel snapshots are written on; False if it cannot be."""
        if self._out is not None:
            return True
        try:
            channel = link.sibling(self._channel)
            self._guard.watch(channel, partial(self._out_closed, channel))
            self._out = confirming(channel, on_ack=self._confirmed, on_nack=self._nacked)
            self._published = 0
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - a snapshot is an optimisation
            self._no_snapshots(escape(exc))
            return False
        return True

    def _out_closed(self, channel: Any, code: int, text: str, class_id: int, method_id: int) -> None:
        link.discard(channel)  # even while confirming() waits for select-ok on it: the wait then ends
        if self._out is channel:
            self._out = None
        self._no_snapshots(f"the broker closed the channel snapshots are written on: {code} {escape(text)}")

    def _abandon_writing(self) -> None:
        self._writer = None
        channel, self._out = self._out, None
        if channel is not None:
            if self._guard is not None:
                self._guard.unwatch(channel)
            link.close_quietly(channel)

    def _publish(self, body: bytes, exchange: str) -> int:
        """Publish ``body`` into the snapshot stream through ``exchange``; return its publish sequence number."""
        link.publish(self._out, link.RawMessage(body, b"\x00\x00"), exchange, SNAPSHOTS)
        self._published += 1
        return self._published

    def _confirmed(self, tag: int, multiple: bool) -> None:
        writer = self._writer
        if writer is None:
            return
        writer.unconfirmed = {seq for seq in writer.unconfirmed if seq > tag} if multiple \
            else writer.unconfirmed - {tag}
        if not writer.unconfirmed:  # the next batch (or the seal) at once, not at the next tick
            self._write_safely()

    def _nacked(self, tag: int, multiple: bool) -> None:
        writer = self._writer
        if writer is not None and any(seq == tag or (multiple and seq <= tag) for seq in writer.unconfirmed):
            writer.failed = f"the broker nacked a record (publish {tag})"

    def _write(self) -> None:
        """Begin a snapshot when the policy says, or carry on with the one being written (from :meth:`tick`)."""
        if not self.ready or not self.enforcing or self._cold or self.snapshots_unreadable is not None:
            return
        writer = self._writer
        if writer is None:
            writer = self._begin()
            if writer is None:
                return
        if writer.failed is not None:
            logger.warning(W_ABANDONED, writer.info.snapshot, SNAPSHOTS, writer.failed)
            self._writer = None
            return
        stop = len(writer.parts) if writer.hold is None else writer.hold
        if writer.sent < stop:
            for body in writer.parts[writer.sent:min(stop, writer.sent + PARTS_PER_TICK)]:
                writer.unconfirmed.add(self._publish(body, SNAPSHOT.exchange))
                writer.sent += 1
            return
        if writer.unconfirmed:
            return
        if writer.sent < len(writer.parts):  # held (a test's hook): never sealed
            if not writer.held:
                writer.held = True
                logger.warning(W_HOLDING, writer.info.snapshot, writer.sent, HOLD_AFTER_PARTS)
            return
        if not writer.sealed:
            writer.unconfirmed.add(self._publish(encode_record(writer.info), SEAL.exchange))
            writer.sealed = True
            return
        self._writer = None
        self.written += 1
        self._learn(writer.info)
        logger.info(I_WROTE, writer.info.snapshot, SNAPSHOTS, writer.entries, len(writer.parts), writer.info.covers,
                    STREAM)

    def _begin(self) -> Optional[_Writer]:
        position = self.position
        if position is None:
            return None
        now = int(self.clock() * 1000)
        known = self._known
        records = None if known is None else position - known.covers
        since = None if self._known_ms is None else now - self._known_ms
        if not self.policy.due(records=records, since_ms=since, live=len(self.live)) or not self._open_out():
            return None
        self._known_ms = now  # an attempt counts for the spacing, whatever becomes of it
        self.live.prune(now, force=True)
        entries = self.live.entries()
        parts, seal = snapshots.encode(uuid.uuid4().hex, entries, covers=position, at=now,
                                       part_entries=self.policy.part_entries)
        hold = self._hold if self._hold is not None and self._hold < len(parts) else None
        self._writer = _Writer(parts, seal, len(entries), hold)
        return self._writer

    # -- the relay's calls ----------------------------------------------------------------------

    def stop_waiting(self) -> None:
        """Never call :meth:`start`'s ``on_ready`` (the relay is stopping)."""
        self._on_ready = None

    def tick(self) -> None:
        """Ack what was read, write snapshots, and relay anyway past :data:`CATCH_UP_TIMEOUT` (the reader's)."""
        self.cancellations.tick()
        self.snapshots.tick()
        self.notices.flush()
        self._write_safely()

    def _write_safely(self) -> None:
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
        self._abandon_writing()
        self._close_snapshots()
        if self._guard is not None and self._channel is not None:
            self._guard.unwatch(self._channel)
        self.cancellations.close()
        self._channel = None
        self._on_ready = None


def _where(offset: Any) -> str:
    """Where a start read from, as a log shows it."""
    return f"offset {offset}" if isinstance(offset, int) else str(offset)
