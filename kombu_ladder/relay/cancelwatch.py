"""CancelWatch: a relay's view of ``ladder.cancellations``, read from its first record, kept in memory."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Optional

from ..cancelling import declare_stream
from ..cancels import STREAM, LiveSet, RecordError, decode, encode_marker
from ..text import escape
from . import link
from .settle import CONNECTION_ERRORS

__all__ = ["CancelWatch", "CATCH_UP_TIMEOUT", "RECORD_PREFETCH"]

logger = logging.getLogger("kombu_ladder.relay")

I_CAUGHT_UP = "read %d live cancellation(s) from %s; relaying"
W_BAD_RECORD = "skipping a record in %s that is not a cancellation: %s"
E_NO_STREAM = ("cannot read the cancellations in %s (%s); relaying WITHOUT enforcing them: a cancelled "
               "message may be delivered")
W_SLOW = "%s was not read to its end within %.0f s; relaying meanwhile, later records still apply"

#: Unacked records the broker may send at once (a stream consumer needs a prefetch).
RECORD_PREFETCH = 2000
#: Records are acked together (``multiple``) once this many are unacked, and the rest at each tick:
#: a stream's acks only give credit, and one ack per record halved the reading speed.
ACK_EVERY = RECORD_PREFETCH // 4
#: Seconds (relay clock) a relay waits to read the stream to its end before relaying anyway.
CATCH_UP_TIMEOUT = 300.0


class CancelWatch:
    """Consumes ``ladder.cancellations`` from offset ``first`` on a channel of its own.

    At start it appends a marker of its own to the stream: once the marker
    comes back, every earlier record has been read, and :meth:`start`'s
    ``on_ready`` is called (the relay then consumes the control queue). Records
    are untrusted: a bad one is logged and skipped.
    """

    def __init__(self, *, clock: Callable[[], float], horizon_ms: int) -> None:
        self.clock = clock
        #: The live cancelled message ids, and task ids (matched against a message's ``correlation_id``).
        self.live = LiveSet(horizon_ms=horizon_ms)
        self.tasks = LiveSet(horizon_ms=horizon_ms)
        #: Records skipped because they were not valid cancellations.
        self.skipped = 0
        self._channel: Any = None
        self._guard: Any = None
        self._token = ""
        self._on_ready: Optional[Callable[[], None]] = None
        self._deadline = 0.0
        #: The last delivery tag taken, and the last acked, on the stream channel.
        self._taken = self._acked = 0

    @property
    def ready(self) -> bool:
        """Whether the stream was read to its end (or given up on) since the last start."""
        return self._on_ready is None

    def start(self, channel: Any, guard: Any, on_ready: Callable[[], None]) -> None:
        """Consume the stream on ``channel`` (a new one of the relay's connection); call ``on_ready`` once caught up."""
        self._channel, self._guard, self._on_ready = channel, guard, on_ready
        self._token = uuid.uuid4().hex
        self._deadline = self.clock() + CATCH_UP_TIMEOUT
        self._taken = self._acked = 0
        guard.watch(channel, self._closed)  # properties stay raw bytes: only the body is read
        try:
            declare_stream(channel)
            channel.basic_qos(0, RECORD_PREFETCH, False)
            channel.basic_consume(STREAM, callback=self._on_record, no_ack=False,
                                  arguments={"x-stream-offset": "first"})
            marker = encode_marker(self._token, at=int(self.clock() * 1000))
            link.publish(channel, link.RawMessage(marker, b"\x00\x00"), "", STREAM)
        except CONNECTION_ERRORS:
            if self._channel is None:  # the broker closed the stream's channel (a 403, say): _closed said why
                return
            raise
        except Exception as exc:  # noqa: BLE001 - without the stream the relay still relays
            logger.error(E_NO_STREAM, STREAM, escape(exc))
            self._ready()

    def _ready(self) -> None:
        on_ready, self._on_ready = self._on_ready, None
        if on_ready is not None:
            on_ready()

    def _closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        link.discard(self._channel)
        self._channel = None
        logger.error(E_NO_STREAM, STREAM, f"the broker closed its channel: {code} {escape(text)}")
        self._ready()

    def _on_record(self, message: Any) -> None:
        channel = self._channel
        try:
            if self._guard is not None and channel is not None:
                self._guard.take(channel)
            self._read(bytes(message.body))
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - no record stops the relay
            self.skipped += 1
            logger.error(W_BAD_RECORD, STREAM, f"{type(exc).__name__}: {escape(exc)}")
        self._taken = message.delivery_info["delivery_tag"]
        if self._taken - self._acked >= ACK_EVERY or self._on_ready is None:
            self._ack()

    def _ack(self) -> None:
        """Ack every record taken so far (one ``multiple`` ack)."""
        if self._channel is not None and self._taken > self._acked:
            self._channel.basic_ack(self._taken, multiple=True)
            self._acked = self._taken

    def _read(self, body: bytes) -> None:
        try:
            record = decode(body)
        except RecordError as exc:
            self.skipped += 1
            logger.warning(W_BAD_RECORD, STREAM, escape(exc))
            return
        now = int(self.clock() * 1000)
        if record.kind == "cancel":
            (self.tasks if record.key == "task_id" else self.live).add(record, now)
        elif record.id == self._token and self._on_ready is not None:
            self.live.prune(now, force=True)
            self.tasks.prune(now, force=True)
            logger.info(I_CAUGHT_UP, len(self.live) + len(self.tasks), STREAM)
            self._ready()

    def stop_waiting(self) -> None:
        """Never call :meth:`start`'s ``on_ready`` (the relay is stopping)."""
        self._on_ready = None

    def tick(self) -> None:
        """Give up waiting for the stream's end after :data:`CATCH_UP_TIMEOUT` (the relay must relay)."""
        self._ack()  # none left unacked for long: RabbitMQ's consumer_timeout applies to streams too
        if self._on_ready is not None and self.clock() >= self._deadline:
            logger.warning(W_SLOW, STREAM, CATCH_UP_TIMEOUT)
            self._ready()

    def cancelled(self, message_id: Any, correlation_id: Any = None) -> Optional[str]:
        """The id under which a message with these properties (bytes as on the wire) is cancelled, or None."""
        now = int(self.clock() * 1000)
        for ids, value in ((self.live, message_id), (self.tasks, correlation_id)):
            if not value or not len(ids):
                continue
            ids.prune(now)
            if isinstance(value, (bytes, bytearray)):
                try:
                    value = bytes(value).decode("utf-8")
                except UnicodeDecodeError:
                    continue
            if ids.cancelled(value, now):
                return str(value)
        return None

    def close(self) -> None:
        """Close the stream channel."""
        if self._guard is not None and self._channel is not None:
            self._guard.unwatch(self._channel)
        link.close_quietly(self._channel)
        self._channel = None
        self._on_ready = None
