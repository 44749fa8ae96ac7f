"""Copying a message onto another publish: its properties, its text fields, and the confirm wiring."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

__all__ = ["CARRIED_PROPERTIES", "COPIED_PROPERTIES", "text_of", "bytes_of", "carried", "prepare_copy", "confirming"]

#: AMQP properties carried unchanged through every hop and onto delivery.
#: ``expiration`` is deliberately absent (never parked in a rung) and so is
#: ``user_id`` (RabbitMQ refuses a republish whose user_id is not the relay's).
CARRIED_PROPERTIES: tuple[str, ...] = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "message_id",
    "priority",
    "timestamp",
    "app_id",
    "cluster_id",
)

#: What a verbatim copy (a move between brokers, a replay from parking) keeps: the carried
#: properties, the message's ``type`` and its delivery mode.
COPIED_PROPERTIES: tuple[str, ...] = (*CARRIED_PROPERTIES, "type", "delivery_mode")


def text_of(value: Any, *, strict: bool = False) -> Optional[str]:
    """A header or property as text: a str as it is, bytes decoded as UTF-8, anything else None.

    Bytes that are not UTF-8 are decoded with replacement characters, or give
    None when ``strict``.
    """
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8", "strict" if strict else "replace")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def bytes_of(body: Any) -> bytes:
    """A message body as bytes: kombu gives a str on some transports (the simulator), py-amqp bytes or a buffer."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8", "surrogateescape")
    return bytes(body or b"")


def carried(properties: Mapping[str, Any], names: tuple[str, ...] = CARRIED_PROPERTIES) -> dict[str, Any]:
    """The properties among ``names`` that ``properties`` sets (None counts as unset)."""
    return {k: properties[k] for k in names if properties.get(k) is not None}


def prepare_copy(channel: Any, body: Any, properties: Mapping[str, Any], headers: Mapping[str, Any]) -> Any:
    """Prepare a py-amqp message on ``channel``: ``body``, the :data:`COPIED_PROPERTIES` set, ``headers``."""
    kept = carried(properties, COPIED_PROPERTIES)
    priority = kept.pop("priority", None)
    content_type = kept.pop("content_type", None)
    content_encoding = kept.pop("content_encoding", None)
    return channel.prepare_message(body, priority, content_type, content_encoding, dict(headers), kept)


def confirming(channel: Any, *, on_ack: Optional[Callable[..., Any]] = None,
               on_nack: Optional[Callable[..., Any]] = None,
               on_return: Optional[Callable[..., Any]] = None) -> Any:
    """Put ``channel`` in confirm mode, with the given handlers of acks, nacks and returns; return it."""
    channel.confirm_select()
    for event, handler in (("basic_ack", on_ack), ("basic_nack", on_nack), ("basic_return", on_return)):
        if handler is not None:
            channel.events[event].add(handler)
    return channel


def waiting_for_confirms(channel: Any) -> Any:
    """Make every publish on ``channel`` wait for the broker's confirm, where it can (py-amqp); return it."""
    confirm = getattr(channel, "basic_publish_confirm", None)
    if confirm is not None:
        channel.basic_publish = confirm
    return channel
