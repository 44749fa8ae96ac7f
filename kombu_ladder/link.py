"""The ladder's hold on a connection: the Link a relay works through, its frame Guard, and py-amqp's Link."""

from __future__ import annotations

import logging
import struct
import time
import weakref
from typing import Any, Callable, Optional, Protocol

from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.connection import Connection as AmqpConnection
from amqp.exceptions import ConnectionError as AMQPConnectionError
from amqp.exceptions import RecoverableConnectionError
from amqp.serialization import dumps

__all__ = [
    "CONNECTION_ERRORS", "HEADER_OVERHEAD", "OnClose", "Schedule", "RawMessage", "sends_encoded", "Guard", "Link",
    "AmqpLink", "link_for", "transport_link", "clock_of", "sibling", "publish", "discard", "close_quietly",
    "drain_until",
]

logger = logging.getLogger("kombu_ladder")

E_TRANSPORT = ("the ladder relay runs on py-amqp (amqp:// or pyamqp:// URLs) or on a transport that offers its "
               "own link (the simulator, ladder-sim://), not on the {!r} transport")

#: What a dead connection raises: these go to the consumer loop, which reconnects.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (AMQPConnectionError, OSError)

#: Bytes of a content-header frame besides the properties: frame header and end (8), class,
#: weight and body size (12). The properties travel in that one frame, so ``frame_max`` bounds them.
HEADER_OVERHEAD = 20

#: Called when the broker closes a watched channel: (reply code, reply text, class id, method id).
OnClose = Callable[[int, str, int, int], None]

#: ``schedule(seconds, callback)``: set one timer entry in a loop; return it (``cancel()``), or anything.
Schedule = Callable[[float, Callable[[], None]], Any]

#: Bytes of a frame besides its payload: type, channel, size and the end octet.
FRAME_OVERHEAD = 8
#: How many encoded publish method frames (one per channel, exchange and routing key) a link keeps.
METHODS_KEPT = 1024
_PUBLISH = struct.pack(">HH", *spec.Basic.Publish)
_CONTENT = struct.Struct(">BHIHHQ").pack
_BODY = struct.Struct(">BHI").pack
_END = b"\xce"


def _frame(kind: int, channel_id: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel_id, len(payload)) + payload + _END


#: Method frame prefix of channel.close, and the properties py-amqp is shown instead of the real ones.
_CLOSE = struct.pack(">HH", *spec.Channel.Close)
_NO_PROPERTIES = b"\x00\x00"


class RawMessage(AmqpMessage):
    """A message whose properties are already encoded: py-amqp sends ``raw`` as it is."""

    def __init__(self, body: bytes, raw: bytes) -> None:
        super().__init__(body)
        self.raw = raw

    def _serialize_properties(self) -> bytes:
        return self.raw


def sends_encoded(channel: Any) -> bool:
    """Whether ``channel`` writes a message's properties with ``_serialize_properties`` (py-amqp's
    channels and the simulator's), so a :class:`RawMessage` goes out exactly as encoded."""
    return (isinstance(getattr(channel, "connection", None), AmqpConnection)
            or getattr(channel, "sends_encoded_properties", False) is True)


class Guard:
    """Stands between a connection's incoming frames and its client, for the relay's channels only.

    On a watched channel, a content header's properties are kept as the bytes
    that arrived (:meth:`take`) and the client is shown none: it decodes
    nothing, so no property can make it fail (a non-UTF-8 content type, a
    timestamp past the year 9999, a table nested 2,000 deep), and the relay
    passes on exactly what it received. A ``channel.close`` from the broker goes
    to the watcher instead of being raised out of ``drain_events`` into the
    consumer loop (where it would stop a Celery worker). Other channels' frames
    pass untouched. Each :class:`Link` has one: py-amqp's feeds it through
    :meth:`filter`, a transport of its own calls :meth:`header` and :meth:`closed`.
    """

    def __init__(self) -> None:
        self._watchers: dict[int, OnClose] = {}
        self._raw: dict[int, bytes] = {}

    def watch(self, channel: Any, on_close: OnClose) -> None:
        """Guard ``channel``: keep its content headers raw and report its closes to ``on_close``."""
        self._watchers[channel.channel_id] = on_close
        self._raw.pop(channel.channel_id, None)

    def unwatch(self, channel: Any) -> None:
        """Stop guarding ``channel`` (before closing it ourselves)."""
        self._watchers.pop(getattr(channel, "channel_id", None), None)  # type: ignore[arg-type]

    def watches(self, channel_id: Optional[int]) -> bool:
        """Whether the channel with this id is guarded."""
        return channel_id in self._watchers

    def header(self, channel_id: int, raw: bytes) -> None:
        """Keep the encoded properties of the content arriving on ``channel_id``."""
        self._raw[channel_id] = raw

    def take(self, channel: Any) -> Optional[bytes]:
        """Return (once) the encoded properties of the last content that arrived on ``channel``."""
        return self._raw.pop(channel.channel_id, None)

    def closed(self, channel_id: int, code: int, text: str, class_id: int, method_id: int) -> bool:
        """Hand a broker's close of ``channel_id`` to its watcher; False when nobody watches it."""
        on_close = self._watchers.pop(channel_id, None)
        if on_close is None:
            return False
        on_close(code, text, class_id, method_id)
        return True

    def filter(self, inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """Return py-amqp's frame handler ``inner`` wrapped with this guard."""

        def on_frame(frame: Any) -> Any:
            kind, channel_id, buf = frame
            if channel_id in self._watchers:
                if kind == 2:
                    self._raw[channel_id] = bytes(buf[12:])
                    return inner((2, channel_id, bytes(buf[:12]) + _NO_PROPERTIES))
                if kind == 1 and bytes(buf[:4]) == _CLOSE and self.closed(channel_id, *_close_args(buf)):
                    return True
            return inner(frame)

        return on_frame


def _close_args(buf: Any) -> tuple[int, str, int, int]:
    code, size = struct.unpack_from(">HB", buf, 4)
    text = bytes(buf[7:7 + size]).decode("utf-8", "replace")
    class_id, method_id = struct.unpack_from(">HH", buf, 7 + size)
    return code, text, class_id, method_id


class Link(Protocol):
    """What the relay needs of one connection, beyond py-amqp's channel methods.

    One per connection (:func:`link_for`), chosen once per transport: py-amqp's
    (:class:`AmqpLink`), or the one a kombu transport offers of its own through a
    ``ladder_link()`` method (the simulator's, on its virtual clock).
    """

    #: Keeps the relay's channels' content headers raw and hands it their closes.
    guard: Guard

    def clock(self) -> float:
        """The time due times are stamped and compared with (epoch seconds)."""

    def monotonic(self) -> float:
        """Seconds that only move forward, for trust windows (the exchange check)."""

    @property
    def frame_max(self) -> int:
        """The largest frame the connection may carry (a content header is one frame)."""

    def sibling(self) -> Any:
        """Open another channel on the connection."""

    def publish_raw(self, channel: Any, message: RawMessage, exchange: str, routing_key: str) -> None:
        """Publish ``message`` (mandatory) without waiting for its confirm and without reading the socket."""

    def discard(self, channel: Any) -> None:
        """Let go of a channel the broker closed: answer ``close-ok`` and free its number."""

    def set_prefetch(self, channel: Any, count: int) -> None:
        """Set the prefetch of ``channel``'s next consumers (``basic.qos``) without waiting for the reply."""

    def forget_consumer(self, channel: Any, tag: str) -> None:
        """Drop the callback of consumer ``tag``, cancelled earlier without waiting for ``cancel-ok``."""

    def timers(self) -> Optional[Schedule]:
        """A timer of the connection's own time (the simulator's virtual one), or None: the driver's loop keeps time."""


class AmqpLink:
    """The :class:`Link` of a py-amqp connection (RabbitMQ): its guard runs on the connection's frames."""

    clock = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)

    def __init__(self, connection: AmqpConnection) -> None:
        self.connection = connection
        self.guard = Guard()
        #: Encoded ``basic.publish`` method frames by (channel id, exchange, routing key).
        self._methods: dict[tuple[int, str, str], bytes] = {}
        connection.on_inbound_frame = self.guard.filter(connection.on_inbound_frame)

    @property
    def frame_max(self) -> int:
        """The ``frame_max`` the connection negotiated."""
        return int(self.connection.frame_max)

    def sibling(self) -> Any:
        """Open another channel on the connection."""
        return self.connection.channel()

    def publish_raw(self, channel: Any, message: RawMessage, exchange: str, routing_key: str) -> None:
        """Send ``basic.publish`` (mandatory) directly.

        py-amqp's ``basic_publish`` first drains incoming frames (to notice
        ``connection.blocked``). Inside the relay that would run its handlers
        re-entrantly: a message handled there publishes *ahead* of the one being
        published, and the broker's confirm numbers no longer match the relay's.
        It also never waits for a confirm where the connection was opened with
        ``confirm_publish``.
        """
        connection = channel.connection
        if not connection:
            raise RecoverableConnectionError("basic_publish: connection closed")
        body, raw = message.body, message.raw
        if not isinstance(body, bytes) or 2 * FRAME_OVERHEAD + len(raw) + len(body) + 64 > connection.frame_max:
            channel.send_method(spec.Basic.Publish, "Bssbb", (0, exchange, routing_key, True, False), message)
            return
        # The frames py-amqp would write, built here: the method frame of each (channel, exchange,
        # routing key) once, then the content header and the body, sent with one write.
        key = (channel.channel_id, exchange, routing_key)
        method = self._methods.get(key)
        if method is None:
            if len(self._methods) >= METHODS_KEPT:
                self._methods.clear()
            args = dumps("Bssbb", (0, exchange, routing_key, True, False))
            method = self._methods[key] = _frame(1, channel.channel_id, _PUBLISH + args)
        channel_id = channel.channel_id
        frames = [method, _CONTENT(2, channel_id, 12 + len(raw), 60, 0, len(body)), raw, _END]
        if body:
            frames += (_BODY(3, channel_id, len(body)), body, _END)
        connection.transport.write(b"".join(frames))
        connection.bytes_sent += 1

    def discard(self, channel: Any) -> None:
        """Answer the broker's ``channel.close`` and free the channel's number."""
        if channel.connection is not None:
            channel.send_method(spec.Channel.CloseOk)
        channel.collect()

    def set_prefetch(self, channel: Any, count: int) -> None:
        """Send ``basic.qos`` without waiting for ``qos-ok`` (py-amqp ignores it when it comes): a wait would
        read, and handle, deliveries inside the handling of one (see :meth:`publish_raw`)."""
        if not channel.connection:
            raise RecoverableConnectionError("basic_qos: connection closed")
        channel.send_method(spec.Basic.Qos, "lBb", (0, count, False))

    def forget_consumer(self, channel: Any, tag: str) -> None:
        """py-amqp drops a consumer's callback on ``cancel-ok`` only, which a ``nowait`` cancel never gets:
        until then deliveries already on their way still reach it."""
        channel.callbacks.pop(tag, None)

    def timers(self) -> Optional[Schedule]:
        """None: the relay's driver keeps time (its loop, a worker's hub)."""
        return None


_links: "weakref.WeakKeyDictionary[Any, Link]" = weakref.WeakKeyDictionary()


def link_for(channel: Any) -> Link:
    """Return the :class:`Link` of ``channel``'s connection, made the first time it is asked for.

    Raises:
        TypeError: the connection is neither py-amqp's nor one whose transport offers a link.
    """
    owner = channel.connection
    link = _links.get(owner)
    if link is None:
        offer = getattr(owner, "ladder_link", None)
        if callable(offer):
            link = offer()
        elif isinstance(owner, AmqpConnection):
            link = AmqpLink(owner)
        else:
            raise TypeError(E_TRANSPORT.format(type(owner).__module__))
        _links[owner] = link
    return link


def transport_link(connection: Any) -> Optional[Link]:
    """The link the transport of kombu ``connection`` offers of its own (no I/O), or None (py-amqp's)."""
    offer = getattr(getattr(connection, "transport", None), "ladder_link", None)
    return offer() if callable(offer) else None


def clock_of(connection: Any, given: Optional[Callable[[], float]] = None, *,
             default: Optional[Callable[[], float]] = time.time) -> Any:
    """The clock to stamp due times with on kombu ``connection``: ``given`` if any, else its transport's
    link's (the simulator's virtual clock), else ``default``."""
    if given is not None:
        return given
    link = transport_link(connection)
    return link.clock if link is not None else default


def sibling(channel: Any) -> Any:
    """Open another channel on ``channel``'s connection."""
    return link_for(channel).sibling()


def publish(channel: Any, message: RawMessage, exchange: str, routing_key: str) -> None:
    """Publish ``message`` on ``channel`` (mandatory) without waiting for a confirm (see :meth:`AmqpLink.publish`)."""
    link_for(channel).publish_raw(channel, message, exchange, routing_key)


def discard(channel: Any) -> None:
    """Let go of a channel the broker closed: answer ``close-ok`` and free its number."""
    link_for(channel).discard(channel)


def close_quietly(channel: Any) -> None:
    """Close a channel of ours; a channel already gone is fine."""
    if channel is None:
        return
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - a dead channel or connection has nothing to close
        logger.debug("closing a channel failed (it was gone already)", exc_info=True)


def drain_until(connection: Any, done: Callable[[], bool], timeout: float,
                every: Optional[Callable[[], None]] = None) -> bool:
    """Handle ``connection``'s events until ``done()`` (True), or until ``timeout`` seconds have passed (False);
    ``every()`` runs after each wait of at most a second."""
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            connection.drain_events(timeout=min(left, 1.0))
        except TimeoutError:  # socket.timeout is TimeoutError
            pass
        if every is not None:
            every()
    return True
