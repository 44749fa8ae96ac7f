"""Frames in bulk on a py-amqp connection a relay's own loop drives: one ``recv`` for many frames, one
``sendall`` for what handling them wrote.

py-amqp reads a frame with two or three ``recv`` calls of exactly the bytes it wants (header, payload,
end octet) and sets the socket's timeout twice around each, and writes each method (a publish, an ack) with a
``sendall`` of its own. A relay moving a few thousand messages a second spends a good part of its CPU in
those system calls. :func:`read_in_bulk` puts a :class:`BulkFrames` on a connection: it reads what the
socket holds (up to :data:`CHUNK` bytes) at once and hands out the frames from that buffer, and the
methods written while those frames are handled are sent together, in the order they were written, once
the last buffered frame's handling returns (or before anything else is written, or before the socket is
read again, or as soon as :data:`KEEP_BYTES` are kept: a confirm that releases fifty publishes of 1 MiB
would otherwise keep a copy of all of them, and join them into another).

Only a loop that keeps calling ``drain_events`` while frames are buffered may use it (the relay's own
:meth:`~kombu_ladder.relay.driver.Relay.run`): an event loop that waits for the socket to be readable
(a Celery worker's hub) would not see the frames already read. Only the plain TCP transport is changed;
an SSL one is left as it is.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
from typing import Any, Optional

from amqp.exceptions import UnexpectedFrame
from amqp.transport import TCPTransport

__all__ = ["CHUNK", "KEEP_BYTES", "BulkFrames", "read_in_bulk"]

logger = logging.getLogger("kombu_ladder")

D_BULK = "reading and writing the relay connection's frames in bulk (up to %d bytes a read)"

#: The most bytes one ``recv`` asks for (a frame bigger than this is read whole, in as many as it takes).
CHUNK = 65536
#: A frame's header (type, channel, payload size) and its end octet.
_HEADER = struct.Struct(">BHI").unpack_from
_FRAME_END = 0xCE
#: The most bytes written during frames' handling that are kept for one ``sendall`` (256 KiB): past it they
#: go out at once, so big bodies cost no extra copies (small writes, acks and small publishes, still go
#: out together).
KEEP_BYTES = 4 * CHUNK
#: ``recv`` errors py-amqp retries (or, on a first read in an event loop, takes as a timeout).
_RETRIED = (errno.EAGAIN, errno.EINTR)
#: Write errors after which py-amqp still considers the connection up (see ``amqp.transport``).
_UNAVAILABLE = frozenset((errno.EAGAIN, errno.EINTR, errno.ENOENT, errno.EWOULDBLOCK))


class BulkFrames:
    """The bulk reader and writer of one py-amqp connection (see the module); :func:`read_in_bulk` installs it.

    Frames come out exactly as py-amqp's ``read_frame`` gives them (type, channel, payload bytes), in
    order; a read the socket's timeout cuts short keeps what arrived. Bytes written while a frame is
    handled are kept, in order, and sent with one ``sendall`` once a frame's handling ends with no
    complete frame left in the buffer, or before any write made elsewhere, or before a ``recv``.
    """

    def __init__(self, connection: Any) -> None:
        transport = connection.transport
        self.connection = connection
        self.transport = transport
        self._sock = transport.sock
        self._recv = transport.sock.recv
        self._sendall = transport.sock.sendall
        #: Bytes read and not yet handed out as frames (with what py-amqp had buffered already).
        self._buf: bytes = bytes(transport._read_buffer)
        transport._read_buffer = b""
        #: Bytes written while frames were being handled, waiting for one ``sendall``.
        self._out: list[bytes] = []
        #: How many bytes :attr:`_out` holds.
        self._kept = 0
        #: Whether a frame is being handled (writes are kept meanwhile).
        self._corked = False
        self._blocking_read = connection.blocking_read

    def install(self) -> "BulkFrames":
        """Take over the connection's frame reading and its transport's socket writes."""
        self.connection.blocking_read = self.blocking_read
        self.transport.read_frame = self.read_frame
        self.transport._write = self._write
        return self

    # -- reading -----------------------------------------------------------------------

    def _complete(self) -> bool:
        """Whether the buffer holds at least one whole frame."""
        buf = self._buf
        return len(buf) >= 7 and len(buf) > 7 + _HEADER(buf, 0)[2]

    def _take(self) -> Optional[tuple[int, int, bytes]]:
        """The next whole frame from the buffer, or None while it holds only part of one."""
        buf = self._buf
        if len(buf) < 7:
            return None
        kind, channel, size = _HEADER(buf, 0)
        end = 7 + size
        if len(buf) <= end:
            return None
        if buf[end] != _FRAME_END:
            raise UnexpectedFrame(f"Received frame_end {buf[end]:#04x} while expecting 0xce")
        payload, self._buf = buf[7:end], buf[end + 1:]
        return kind, channel, payload

    def _wanted(self) -> int:
        """How many more bytes the next frame needs (its header first)."""
        buf = self._buf
        if len(buf) < 7:
            return 7 - len(buf)
        return 8 + _HEADER(buf, 0)[2] - len(buf)

    def read_frame(self, unpack: Any = None) -> tuple[int, int, bytes]:
        """The next frame, reading the socket (within the timeout the caller set) only when none is buffered."""
        frame = self._take()
        while frame is None:
            self.flush()
            self._fill()
            frame = self._take()
        return frame

    def _fill(self) -> None:
        """One ``recv``: what the socket holds, at most :data:`CHUNK` bytes or what the next frame needs."""
        try:
            while True:
                try:
                    chunk = self._recv(max(CHUNK, self._wanted()))
                    break
                except socket.timeout:
                    raise
                except OSError as exc:
                    if exc.errno not in _RETRIED:
                        raise
                    if not self._buf and self.transport.raise_on_initial_eintr:
                        raise socket.timeout() from exc
        except OSError as exc:
            self._failed(exc)
            raise
        if not chunk:
            self.transport.connected = False
            raise OSError("Server unexpectedly closed connection")
        self._buf = self._buf + chunk if self._buf else chunk

    def blocking_read(self, timeout: Optional[float] = None) -> Any:
        """py-amqp's ``Connection.blocking_read``: handle one frame; the socket's timeout is set only to read it."""
        frame = self._take()
        if frame is None:
            self.flush()
            with self.transport.having_timeout(timeout):
                frame = self.read_frame()
        outer, self._corked = self._corked, True
        try:
            return self.connection.on_inbound_frame(frame)
        finally:
            self._corked = outer  # a frame read inside another's handling (a wait for a reply) leaves it corked
            if not outer and not self._complete():
                self.flush()

    # -- writing -----------------------------------------------------------------------

    def _write(self, data: Any) -> None:
        """The transport's socket write: kept while a frame is handled, else sent at once (after what was kept)."""
        if self._corked:
            if self._kept + len(data) > KEEP_BYTES:
                self.flush()  # what was kept first, in order; then this one, uncopied
                self._sendall(data)
                return
            self._out.append(bytes(data))  # py-amqp writes from a buffer it reuses: keep a copy
            self._kept += len(data)
            return
        if self._out:
            self._out.append(bytes(data))
            self.flush()
            return
        self._sendall(data)

    def flush(self) -> None:
        """Send what was kept, with one ``sendall``."""
        out = self._out
        if not out:
            return
        self._out, self._kept = [], 0
        try:
            self._sendall(out[0] if len(out) == 1 else b"".join(out))
        except OSError as exc:
            self._failed(exc)
            raise

    def _failed(self, exc: OSError) -> None:
        """A socket error: the connection is down unless it was a timeout or a retry (as py-amqp reckons)."""
        if not isinstance(exc, socket.timeout) and exc.errno not in _UNAVAILABLE:
            self.transport.connected = False


def read_in_bulk(connection: Any) -> Optional[BulkFrames]:
    """Install a :class:`BulkFrames` on py-amqp ``connection`` (a kombu connection's ``.connection``), once.

    Returns it, or None when the connection is not py-amqp's over plain TCP (SSL, the simulator):
    those are left as they are.
    """
    transport = getattr(connection, "transport", None)
    if type(transport) is not TCPTransport or getattr(transport, "sock", None) is None:
        return None
    bulk = getattr(connection, "_ladder_bulk", None)
    if isinstance(bulk, BulkFrames) and bulk.transport is transport:
        return bulk
    bulk = BulkFrames(connection).install()
    connection._ladder_bulk = bulk
    logger.debug(D_BULK, CHUNK)
    return bulk
