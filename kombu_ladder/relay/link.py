"""The relay's hold on its connection: content headers as raw bytes, the broker's channel closes, raw publishes."""

from __future__ import annotations

import struct
import weakref
from typing import Any, Callable, Optional

from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.channel import Channel as AmqpChannel
from amqp.exceptions import RecoverableConnectionError

__all__ = ["RawMessage", "Guard", "guard_of", "max_properties", "sibling", "publish", "discard", "close_quietly"]

E_TRANSPORT = ("the ladder relay runs on py-amqp (amqp:// or pyamqp:// URLs) or on the simulator "
               "(ladder-sim://), not on the {!r} transport")

#: Method frame prefix of channel.close, and the properties py-amqp is shown instead of the real ones.
_CLOSE = struct.pack(">HH", *spec.Channel.Close)
_NO_PROPERTIES = b"\x00\x00"

#: Called when the broker closes a watched channel: (reply code, reply text, class id, method id).
OnClose = Callable[[int, str, int, int], None]


class RawMessage(AmqpMessage):
    """A message whose properties are already encoded: py-amqp sends ``raw`` as it is."""

    def __init__(self, body: bytes, raw: bytes) -> None:
        super().__init__(body)
        self.raw = raw

    def _serialize_properties(self) -> bytes:
        return self.raw


class Guard:
    """Stands between a connection's incoming frames and py-amqp, for the relay's channels only.

    On a watched channel, a content header's properties are kept as the bytes
    that arrived (:meth:`take`) and py-amqp is shown none: it decodes nothing,
    so no property can make it fail (a non-UTF-8 content type, a timestamp past
    the year 9999, a table nested 2,000 deep), and the relay passes on exactly
    what it received. A ``channel.close`` from the broker goes to the watcher
    instead of being raised out of ``drain_events`` into the consumer loop
    (where it would stop a Celery worker). Other channels' frames pass untouched.
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


_guards: "weakref.WeakKeyDictionary[Any, Guard]" = weakref.WeakKeyDictionary()


def guard_of(channel: Any) -> Guard:
    """Return the :class:`Guard` of ``channel``'s connection, installing it the first time."""
    connection = channel.connection
    if isinstance(channel, AmqpChannel):
        guard = _guards.get(connection)
        if guard is None:
            guard = _guards[connection] = Guard()
            connection.on_inbound_frame = guard.filter(connection.on_inbound_frame)
        return guard
    if hasattr(connection, "guard"):  # the simulator's transport calls the guard where py-amqp would
        if connection.guard is None:
            connection.guard = Guard()
        return connection.guard  # type: ignore[no-any-return]
    raise TypeError(E_TRANSPORT.format(type(connection).__module__))


#: Bytes of a content-header frame besides the properties: frame header and end (8), class,
#: weight and body size (12).
_HEADER_OVERHEAD = 20


def max_properties(channel: Any) -> int:
    """The most bytes of encoded properties one publish on ``channel``'s connection may carry.

    They travel in a single frame, so the negotiated ``frame_max`` bounds them;
    a bigger one makes the broker close the whole connection (FRAME_ERROR).
    """
    return int(getattr(channel.connection, "frame_max", 131072)) - _HEADER_OVERHEAD


def sibling(channel: Any) -> Any:
    """Open another channel on ``channel``'s connection."""
    if isinstance(channel, AmqpChannel):
        return channel.connection.channel()
    return channel.connection.create_channel(channel.connection)


def publish(channel: Any, message: RawMessage, exchange: str, routing_key: str) -> None:
    """Publish ``message`` (mandatory) without waiting for its confirm and without reading the socket.

    py-amqp's ``basic_publish`` first drains incoming frames (to notice
    ``connection.blocked``). Inside the relay that would run its handlers
    re-entrantly: a message handled there publishes *ahead* of the one being
    published, and the broker's confirm numbers no longer match the relay's.
    So on py-amqp the ``basic.publish`` method is sent directly; it also never
    waits for a confirm where the connection was opened with ``confirm_publish``.
    """
    if isinstance(channel, AmqpChannel):
        if not channel.connection:
            raise RecoverableConnectionError("basic_publish: connection closed")
        channel.send_method(spec.Basic.Publish, "Bssbb", (0, exchange, routing_key, True, False), message)
        return
    type(channel).basic_publish(channel, message, exchange=exchange, routing_key=routing_key, mandatory=True)


def discard(channel: Any) -> None:
    """Let go of a channel the broker closed: answer ``close-ok`` and free its number."""
    if isinstance(channel, AmqpChannel):
        if channel.connection is not None:
            channel.send_method(spec.Channel.CloseOk)
        channel.collect()
        return
    channel.discard()


def close_quietly(channel: Any) -> None:
    """Close a channel of ours; a channel already gone is fine."""
    if channel is None:
        return
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - a dead channel or connection has nothing to close
        pass
