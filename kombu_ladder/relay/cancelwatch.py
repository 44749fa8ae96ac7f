"""CancelWatch: a relay's view of ``ladder.cancellations``, read from the oldest record that may matter."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Callable, Optional

from .. import link
from ..cancellation.records import (
    CELERY_TASK_HEADER,
    READ_BACK_MS,
    STREAM,
    LiveSet,
    cancelled_id,
    read_from,
)
from ..controlplane import MARKER, READ_PREFETCH, READ_TIMEOUT
from ..controlplane.codec import Cancel, Marker, RecordError, decode, encode
from ..controlplane.reader import SKIPS
from ..link import CONNECTION_ERRORS
from ..notices import Notices
from ..text import escape
from ..topology import declare_control_plane_if_allowed

__all__ = ["CancelWatch", "CATCH_UP_TIMEOUT", "RECORD_PREFETCH", "READ_BACK_MS", "CELERY_TASK_HEADER", "cancelled_id",
           "read_from"]

logger = logging.getLogger("kombu_ladder.relay")

I_CAUGHT_UP = "read %d live cancellation(s) from %s; relaying"
W_BAD_RECORD = "skipping a record in %s that is not a cancellation: %s"
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
class CancelWatch:
    """Consumes ``ladder.cancellations`` on a channel of its own, from the records of the last
    :data:`READ_BACK_MS` (by the broker's append time; a stream starts at the chunk holding it).

    At start it appends a marker of its own to the stream: once the marker
    comes back, every earlier record has been read, and :meth:`start`'s
    ``on_ready`` is called (the relay then consumes the control queue). Records
    are untrusted: a bad one is logged and skipped.
    """

    def __init__(self, *, clock: Callable[[], float], notices: Optional[Notices] = None) -> None:
        self.clock = clock
        #: The live cancelled ids: each is matched against a message's ``message_id``, and against the
        #: ``correlation_id`` of a Celery task message (its task id), whatever the record's ``key``.
        self.live = LiveSet()
        #: Where the per-record warnings go, rate-limited (the relay's, when it has them).
        self.notices = notices if notices is not None else Notices(logger)
        #: Records skipped because they were not valid cancellations.
        self.skipped = 0
        #: Records (cancellations and markers) read since the last start.
        self.read = 0
        #: Why the stream could not be read since the last start (None: read, or not started yet).
        self.unreadable: Optional[str] = None
        self._channel: Any = None
        self._guard: Any = None
        self._token = ""
        self._on_ready: Optional[Callable[[], None]] = None
        self._deadline = 0.0
        #: The last delivery tag taken, and the last acked, on the stream channel.
        self._taken = self._acked = 0

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
        guard.watch(channel, self._closed)  # properties stay raw bytes: only the body is read
        try:
            declare_control_plane_if_allowed(channel)  # full rights (a worker the README's way); else the operator's
            channel.basic_qos(0, RECORD_PREFETCH, False)
            channel.basic_consume(STREAM, callback=self._on_record, no_ack=False,
                                  arguments={"x-stream-offset": self.read_from()})
            marker = encode(Marker(self._token, int(self.clock() * 1000)))
            link.publish(channel, link.RawMessage(marker, b"\x00\x00"), MARKER.exchange, STREAM)
        except CONNECTION_ERRORS:
            if self._channel is None:  # the broker closed the stream's channel (a 403, say): _closed said why
                return
            raise
        except Exception as exc:  # noqa: BLE001 - without the stream the relay still relays
            self.unreadable = escape(exc)
            logger.error(E_NO_STREAM, STREAM, self.unreadable)
            self._ready()

    def read_from(self) -> datetime:
        """The stream offset a start reads from: :data:`READ_BACK_MS` ago (a timestamp, whole seconds)."""
        return read_from(self.clock())

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
            if self._guard is not None and channel is not None:
                self._guard.take(channel)
            self._read(bytes(message.body), message.delivery_info.get("exchange"))
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - no record stops the relay
            self.skipped += 1
            self.notices.warn("cancellation record", W_BAD_RECORD, STREAM, f"{type(exc).__name__}: {escape(exc)}",
                              level=logging.ERROR)
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
            record = decode(body, exchange)
        except RecordError as exc:
            self.skipped += 1
            SKIPS.count(STREAM, exc.kind, exc.reason)
            self.notices.warn("cancellation record", W_BAD_RECORD, STREAM, escape(exc))
            return
        now = int(self.clock() * 1000)
        if isinstance(record, Cancel):  # one id or a batch
            for each in record.each():
                self.live.add(each, now)
        elif isinstance(record, Marker) and record.token == self._token and self._on_ready is not None:
            self.live.prune(now, force=True)
            logger.info(I_CAUGHT_UP, len(self.live), STREAM)
            self._ready()

    def stop_waiting(self) -> None:
        """Never call :meth:`start`'s ``on_ready`` (the relay is stopping)."""
        self._on_ready = None

    def tick(self) -> None:
        """Give up waiting for the stream's end after :data:`CATCH_UP_TIMEOUT` (the relay must relay)."""
        self._ack()  # none left unacked for long: RabbitMQ's consumer_timeout applies to streams too
        self.notices.flush()
        if self._on_ready is not None and self.clock() >= self._deadline:
            logger.warning(W_SLOW, STREAM, CATCH_UP_TIMEOUT)
            self._ready()

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
        """Close the stream channel."""
        if self._guard is not None and self._channel is not None:
            self._guard.unwatch(self._channel)
        link.close_quietly(self._channel)
        self._channel = None
        self._on_ready = None
