"""StreamReader: the one reader of the control plane's streams (catch-up, tail, resume, re-created streams).

API (stable: other modules build on it)::

    reader = StreamReader(stream, start="first" | <int offset> | <datetime> | <callable returning one>,
                          clock=time.time, timer=time.monotonic, timeout=READ_TIMEOUT, prefetch=READ_PREFETCH,
                          skips=SKIPS, notices=None)

    # callback face: an event loop the caller drives (drain_events on the channel's connection)
    reader.start(channel, offset=None, on_record=fn(record, offset), on_caught_up=fn(), on_reset=fn(),
                 take_raw=None)   # consume, then append a marker
    reader.mark()                 # append another marker: on_caught_up is called again once it is read
    reader.tick()                 # ack what was read (one multiple ack), flush log lines, give up on a slow
                                  # catch-up after ``timeout`` (on_caught_up then, ``timed_out`` set)
    reader.close()

    # blocking face: the CLI, the index's sync, migrate, peek
    result = read_to_end(connection, stream, on_record=fn(record, offset), start=..., position=None,
                         timeout=READ_TIMEOUT, clock=None, on_reset=None)   # -> ReadResult
    reader.read_to_end(connection, on_record=..., on_reset=None)           # the same, keeping ``position``

``on_record`` gets each decoded record (:mod:`~kombu_ladder.controlplane.codec`: a ``Cancel``, ``Entries`` or
``Adoption``; never a marker) with its stream offset (the ``x-stream-offset`` the broker sets on the delivery;
None when unknown). A batch ``Cancel`` is one record: ``record.each()`` expands it. :attr:`StreamReader.position`
is the offset of the next record: a new :meth:`~StreamReader.start` (a reconnect) goes on from there, and the
records before it that the broker sends again (it starts at the chunk holding an offset) are skipped, so none
is handed on twice. A record that is not valid (:class:`~kombu_ladder.controlplane.codec.RecordError`), or that
``on_record`` refuses by raising one, is counted in :attr:`StreamReader.skipped` and in :data:`SKIPS` (by
stream, kind and reason) and logged rate-limited; no exception from one record escapes but a lost connection.

A stream deleted and declared again (a vhost re-created, a broker reset) is noticed when a reader goes on
from its position: it first appends its marker and reads it from the stream's last chunk; at an offset below
the position (RabbitMQ, asked for an offset past a new stream's end, may wait for it for ever), it logs
:data:`W_RECREATED`, calls ``on_reset`` (forget what was read from the old stream) and reads again from
``start``. A re-created stream that already holds more records than the position is not noticed (nothing tells
the streams apart).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Optional, Union

from amqp.serialization import decode_properties_basic

from .. import link
from ..link import CONNECTION_ERRORS, close_quietly
from ..notices import Notices
from ..text import escape
from .codec import Marker, RecordError, decode, encode
from .table import MARKER, READ_PREFETCH, READ_TIMEOUT

__all__ = ["StreamReader", "ReadResult", "ReadError", "StreamMissing", "NotReadToEnd", "Skips", "SKIPS",
           "Offset", "Start", "OnRecord", "read_to_end", "OFFSET_ARGUMENT", "ACK_SHARE", "RETRY_EVERY",
           "W_RECREATED", "W_SKIPPED", "W_SLOW"]

logger = logging.getLogger("kombu_ladder.controlplane")

W_SKIPPED = "skipping a record in %s (%s): %s"
W_RECREATED = ("%s was deleted and declared again (it ends at offset %d, before offset %d where this reader "
               "goes on from): reading it again from %s")
W_SLOW = "%s was not read to its end within %.0f s (%d record(s) read); going on without the rest"
E_HANDLER = "a record of %s at offset %s could not be applied (%s); it is skipped"

#: The consumer argument (and the delivery header) of a stream offset: this module alone names it.
OFFSET_ARGUMENT = "x-stream-offset"
#: Records are acked together (``multiple``) once this share of the reader's prefetch is unacked, and the rest at
#: each tick: a stream's acks only give credit, and one ack per record halved the reading speed. A share, not a
#: count: the snapshot reader's prefetch (64) is below a count fit for the cancellations' (2,000), and it waited
#: for a tick every 64 parts (2.2 s of a 2.6 s start).
ACK_SHARE = 4
#: Seconds between tries of a stream the broker does not serve yet (its node just restarted: 404 "home node").
RETRY_EVERY = 0.5

#: Where a reader starts: an offset, ``"first"``/``"last"``/``"next"``, or a timestamp (the broker's append time,
#: whole seconds; it starts at the chunk holding it).
Offset = Union[int, str, datetime]
#: A start policy: an :data:`Offset`, or a callable giving one at each start (a window that moves with time).
Start = Union[Offset, Callable[[], Offset]]
#: Called with each record and its offset.
OnRecord = Callable[[Any, Optional[int]], None]


class Skips:
    """Records skipped by every reader of this process, by (stream, kind, reason): what the metrics export."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def count(self, stream: str, kind: Optional[str], reason: str) -> None:
        """Count one skipped record."""
        with self._lock:
            self._counts[(stream, kind or "none", reason)] += 1

    def as_dict(self) -> dict[tuple[str, str, str], int]:
        """The counts so far, by (stream, kind, reason)."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        """Every skipped record so far."""
        with self._lock:
            return sum(self._counts.values())


#: The process's skip counters (every :class:`StreamReader` counts into it unless given its own).
SKIPS = Skips()


class ReadError(Exception):
    """A stream could not be read to its end (the message says which, and why)."""


class StreamMissing(ReadError):
    """The stream does not exist (the operator's ``declare`` creates it)."""


class NotReadToEnd(ReadError):
    """The stream was not read to its end within the timeout (what was read was handed on)."""


@dataclass
class ReadResult:
    """What one :func:`read_to_end` read."""

    #: Records handed to ``on_record`` (a batch counts once), and records skipped.
    records: int = 0
    skipped: int = 0
    #: The offset of the next record (None: unknown).
    position: Optional[int] = None
    #: Whether the stream was found deleted and declared again (and read again from its start).
    reset: bool = False


def _offset_of(headers: Any) -> Optional[int]:
    offset = headers.get(OFFSET_ARGUMENT) if isinstance(headers, dict) else None
    return offset if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0 else None


def offset_from_raw(raw: Optional[bytes]) -> Optional[int]:
    """The stream offset in encoded basic properties (a guarded channel's, see :class:`kombu_ladder.link.Guard`);
    None when absent or unreadable."""
    if not raw:
        return None
    try:
        properties, _ = decode_properties_basic(raw, 0)
    except Exception:  # noqa: BLE001 - untrusted bytes: an unreadable header is an unknown offset
        return None
    return _offset_of(properties.get("application_headers"))


def _headers(message: Any) -> Any:
    properties = getattr(message, "properties", None)
    if isinstance(properties, dict) and "application_headers" in properties:
        return properties["application_headers"]
    return getattr(message, "headers", None)


class StreamReader:
    """Reads one stream of the control plane: see the module's docstring for its two faces."""

    def __init__(self, stream: str, *, start: Start = "first", clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.monotonic, timeout: float = READ_TIMEOUT,
                 prefetch: int = READ_PREFETCH, skips: Optional[Skips] = None,
                 notices: Optional[Notices] = None) -> None:
        self.stream = stream
        self.start_policy = start
        self.clock, self.timer, self.timeout, self.prefetch = clock, timer, timeout, prefetch
        self._ack_every = max(1, prefetch // ACK_SHARE)
        self.skips = SKIPS if skips is None else skips
        self.notices = notices if notices is not None else Notices(logger)
        #: The offset of the next record: where a new :meth:`start` goes on from (None: from ``start``).
        self.position: Optional[int] = None
        #: Records handed on, and records skipped (by reason), since this reader was made.
        self.read = 0
        self.skipped: Counter[str] = Counter()
        #: Times the stream was found deleted and declared again.
        self.resets = 0
        #: Whether the last marker came back (every record before it was read), and whether the last catch-up
        #: was given up after ``timeout`` instead.
        self.caught_up = False
        self.timed_out = False
        self._channel: Any = None
        self._tag: Optional[str] = None
        self._token = ""
        self._probing = False
        self._deadline = 0.0
        self._taken = self._acked = 0
        self._on_record: OnRecord = _nothing
        self._on_caught_up: Optional[Callable[[], None]] = None
        self._on_reset: Optional[Callable[[], None]] = None
        self._take_raw: Optional[Callable[[Any], Optional[bytes]]] = None

    # -- the callback face ------------------------------------------------------------------------

    def start(self, channel: Any, *, on_record: OnRecord, offset: Optional[Offset] = None,
              on_caught_up: Optional[Callable[[], None]] = None, on_reset: Optional[Callable[[], None]] = None,
              take_raw: Optional[Callable[[Any], Optional[bytes]]] = None) -> None:
        """Consume the stream on ``channel`` (nothing is declared), then append a marker.

        It starts at ``offset`` if given, else at :attr:`position` (a reconnect goes on where the last
        channel stopped), else at the start policy. ``take_raw(channel)`` gives the encoded properties
        of the delivery being handled, on a channel whose properties are kept raw (the relay's guard).

        Raises:
            the channel's errors (404: the stream does not exist; 403: this user may not read it).
        """
        self._channel, self._on_record, self._take_raw = channel, on_record, take_raw
        self._on_caught_up, self._on_reset = on_caught_up, on_reset
        self._taken = self._acked = 0
        self._consume(offset)

    def _consume(self, offset: Optional[Offset]) -> None:
        channel = self._channel
        channel.basic_qos(0, self.prefetch, False)
        if isinstance(offset, int) and offset > 0:
            # A given offset (a snapshot's: the records after the ones it covers) is checked as a position is:
            # a snapshot of the stream before it was deleted and declared again names an offset past its end.
            self.position, offset = offset, None
        if offset is None and self.position:
            # Going on from a position: first make sure the stream is the one it was read from. A marker is
            # appended and read from the stream's last chunk: at an offset below the position, the stream is
            # a new one (RabbitMQ, asked for an offset past a new stream's end, may wait for it forever).
            self._probing = True
            self.mark()
            self._tag = self._subscribe(self._on_probe, "last", wait=True)
            return
        self._follow(self._policy() if offset is None else offset, wait=True)
        self.mark()

    def _follow(self, offset: Offset, *, wait: bool) -> None:
        """Consume from ``offset`` (records before :attr:`position` are then skipped as read already)."""
        self._probing = False
        if isinstance(offset, int):
            self.position = offset
        elif offset == "first":
            self.position = 0
        else:
            self.position = None
        self._tag = self._subscribe(self._on_message, offset, wait=wait)

    def _subscribe(self, callback: Callable[[Any], None], offset: Offset, *, wait: bool) -> str:
        """Start a consumer (inside a delivery's handling, ``wait=False``: nothing is read meanwhile)."""
        tag = f"ladder-reader-{uuid.uuid4().hex[:12]}"
        self._channel.basic_consume(self.stream, consumer_tag=tag, callback=callback, no_ack=False,
                                    nowait=not wait, arguments={OFFSET_ARGUMENT: offset})
        return tag

    def _unsubscribe(self) -> None:
        channel, tag, self._tag = self._channel, self._tag, None
        if channel is not None and tag is not None:
            channel.basic_cancel(tag, nowait=True)
            link.link_for(channel).forget_consumer(channel, tag)

    def _on_probe(self, message: Any) -> None:
        """A delivery from the stream's last chunk: the marker just appended says where the stream ends."""
        info = getattr(message, "delivery_info", None) or {}
        try:
            offset = self._offset(message)
            if self._probing and offset is not None and self._is_mine(message.body, info.get("exchange")):
                self._unsubscribe()
                position = self.position or 0
                if offset < position:
                    self._reset(offset, position)
                    self._follow(self._policy(), wait=False)
                else:
                    self._follow(position, wait=False)
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary: no record stops a reader
            self._skip(None, "malformed", f"{type(exc).__name__}: {escape(exc)}")
        self._took(info.get("delivery_tag", 0))

    def _is_mine(self, body: Any, exchange: Any) -> bool:
        """Whether ``body`` is this reader's last marker."""
        text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else str(body)
        if self._token not in text:
            return False
        try:
            record = decode(body, exchange)
        except RecordError:
            return False
        return isinstance(record, Marker) and record.token == self._token

    def _reset(self, end: int, position: int) -> None:
        logger.warning(W_RECREATED, self.stream, end, position, self._policy())
        self.resets += 1
        self.position = None
        if self._on_reset is not None:
            self._on_reset()

    def _policy(self) -> Offset:
        policy = self.start_policy
        return policy() if callable(policy) else policy

    def mark(self) -> None:
        """Append a marker of this reader's: ``on_caught_up`` is called once it is read back (or after ``timeout``)."""
        self._token = uuid.uuid4().hex
        self.caught_up = self.timed_out = False
        self._deadline = self.timer() + self.timeout
        body = encode(Marker(self._token, int(self.clock() * 1000)))
        link.publish(self._channel, link.RawMessage(body, b"\x00\x00"), MARKER.exchange, self.stream)

    def tick(self) -> None:
        """Ack what was read, write the rate-limited log lines, and give up a catch-up past its ``timeout``."""
        self._ack()
        self.notices.flush()
        if not self.caught_up and self._channel is not None and self.timer() >= self._deadline:
            logger.warning(W_SLOW, self.stream, self.timeout, self.read)
            self.timed_out = True
            self._caught_up()

    def close(self) -> None:
        """Stop reading: close the channel (:attr:`position` is kept for the next :meth:`start`)."""
        channel, self._channel = self._channel, None
        self._on_caught_up = None
        close_quietly(channel)

    @property
    def reading(self) -> bool:
        """Whether a channel is being read."""
        return self._channel is not None

    def forget_channel(self) -> Any:
        """Forget the channel without closing it (the broker closed it, or the connection is gone); return it."""
        channel, self._channel = self._channel, None
        return channel

    def _caught_up(self) -> None:
        self.caught_up = True
        self._ack()
        callback = self._on_caught_up
        if callback is not None:
            callback()

    def _ack(self) -> None:
        if self._channel is not None and self._taken > self._acked:
            self._channel.basic_ack(self._taken, multiple=True)
            self._acked = self._taken

    def _on_message(self, message: Any) -> None:
        info = getattr(message, "delivery_info", None) or {}
        try:
            self._handle(message, info)
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary: no record stops a reader
            self._skip(None, "malformed", f"{type(exc).__name__}: {escape(exc)}")
        self._took(info.get("delivery_tag", 0))

    def _took(self, tag: Any) -> None:
        if isinstance(tag, int) and tag > self._taken:
            self._taken = tag
        if self._taken - self._acked >= self._ack_every:
            self._ack()

    def _offset(self, message: Any) -> Optional[int]:
        """The delivery's stream offset (from the raw properties on a guarded channel)."""
        if self._take_raw is not None:
            return offset_from_raw(self._take_raw(self._channel) if self._channel is not None else None)
        return _offset_of(_headers(message))

    def _handle(self, message: Any, info: dict[str, Any]) -> None:
        offset = self._offset(message)
        body = message.body
        if offset is not None and self.position is not None and offset < self.position:
            return  # RabbitMQ starts at the chunk holding an offset: read already
        if offset is not None:
            self.position = offset + 1
        elif self.position is not None and self._take_raw is None:
            self.position += 1
        try:
            record = decode(body, info.get("exchange"))
        except RecordError as exc:
            self._skip(exc.kind, exc.reason, escape(exc))
            return
        if isinstance(record, Marker):
            if record.token == self._token and not self.caught_up:
                self._caught_up()
            return
        try:
            self._on_record(record, offset)
        except RecordError as exc:
            self._skip(exc.kind, exc.reason, escape(exc))
            return
        self.read += 1

    def _skip(self, kind: Optional[str], reason: str, why: str) -> None:
        self.skipped[reason] += 1
        self.skips.count(self.stream, kind, reason)
        self.notices.warn(f"{self.stream} record", W_SKIPPED, self.stream, reason, why)

    # -- the blocking face ------------------------------------------------------------------------

    def read_to_end(self, connection: Any, *, on_record: OnRecord,
                    on_reset: Optional[Callable[[], None]] = None) -> ReadResult:
        """Read the stream on a channel of ``connection``'s own, from :attr:`position` (else the start policy),
        to a marker appended now: every record written before this call is handed to ``on_record``.

        Raises:
            StreamMissing: the stream does not exist.
            NotReadToEnd: it was not read to its end within ``timeout`` seconds (``position`` is where it got).
            ReadError: the broker refused to let this user read it (the message says why).
        """
        read, skipped, resets = self.read, sum(self.skipped.values()), self.resets
        deadline = time.monotonic() + self.timeout
        self._open(connection, deadline, on_record, on_reset)
        try:
            if not link.drain_until(connection, lambda: self.caught_up, deadline - time.monotonic(), self._ack):
                raise NotReadToEnd(f"{self.stream} was not read to its end within {self.timeout:g} s "
                                   f"({self.read - read} record(s) read; reading again goes on from there)")
        finally:
            self.close()
            self.notices.flush()
        return ReadResult(self.read - read, sum(self.skipped.values()) - skipped, self.position,
                          self.resets > resets)

    def _open(self, connection: Any, deadline: float, on_record: OnRecord,
              on_reset: Optional[Callable[[], None]]) -> None:
        while True:
            channel = connection.channel()
            try:
                self.start(channel, on_record=on_record, on_reset=on_reset)
                return
            except connection.channel_errors as exc:
                self.forget_channel()
                close_quietly(channel)
                code, text = getattr(exc, "reply_code", None), getattr(exc, "reply_text", None) or exc
                if code == 403:
                    raise ReadError(f"{self.stream} may not be read by this user ({text})") from None
                if code != 404:
                    raise
                if "home node" not in str(text):
                    raise StreamMissing(f"{self.stream} does not exist ({text}): the operator's "
                                        f"'kombu-ladder declare' declares it") from None
                if time.monotonic() >= deadline:
                    raise ReadError(f"{self.stream} is not served by the broker yet ({text})") from None
            time.sleep(RETRY_EVERY)


def _nothing(record: Any, offset: Optional[int]) -> None:
    """The ``on_record`` of a reader not started."""


def read_to_end(connection: Any, stream: str, *, on_record: OnRecord, start: Start = "first",
                position: Optional[int] = None, timeout: float = READ_TIMEOUT,
                clock: Optional[Callable[[], float]] = None, on_reset: Optional[Callable[[], None]] = None,
                notices: Optional[Notices] = None) -> ReadResult:
    """Read ``stream`` from ``position`` (else ``start``) to its end now: see :meth:`StreamReader.read_to_end`.

    ``clock`` stamps the marker (default: the connection's, the simulator's virtual one on ``ladder-sim://``).
    """
    reader = StreamReader(stream, start=start, clock=link.clock_of(connection, clock), timeout=timeout,
                          notices=notices)
    reader.position = position
    return reader.read_to_end(connection, on_record=on_record, on_reset=on_reset)
