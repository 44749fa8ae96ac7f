"""What a delayed republish copies of a consumed message, and what it adds (no I/O)."""

from __future__ import annotations

from typing import Any

from kombu.compression import compress

from .carry import text_of
from .contract import ORIGINAL_ROUTING_KEY, REPUBLISH_COUNT
from .plan import parse_due_at

__all__ = ["original_routing_key", "republish_count", "republish_copy"]

#: The AMQP properties a republished copy keeps (its content type and encoding are set apart).
KEPT_PROPERTIES = ("correlation_id", "reply_to", "message_id", "priority", "app_id")


def original_routing_key(message: Any) -> str:
    """Return the routing key a (possibly republished) message was first consumed with."""
    headers = message.headers or {}
    key = text_of(headers.get(ORIGINAL_ROUTING_KEY))
    return key if key is not None else (message.delivery_info or {}).get("routing_key", "")


def republish_count(message: Any) -> int:
    """Return how many times ``message`` has been republished (0 for an original)."""
    count = parse_due_at((message.headers or {}).get(REPUBLISH_COUNT))
    return count if count is not None and count > 0 else 0


def body_as_it_came(message: Any) -> Any:
    """The body bytes a consumed message arrived with.

    kombu decompresses a body with a ``compression`` header when the message is
    received; republished with that header, it must be compressed again (kombu's
    codecs are deterministic: the same bytes come back). A body kombu could not
    decompress is left as it came.
    """
    compression = (message.headers or {}).get("compression")
    if not compression or getattr(message, "errors", None):
        return message.body
    body = message.body
    return compress(body.encode("utf-8") if isinstance(body, str) else body, compression)[0]


def republish_copy(message: Any) -> tuple[Any, dict[str, Any], int]:
    """Return the body, the publish options and the republish count of ``message``'s copy.

    The copy keeps the body as it came (compressed again if kombu decompressed it),
    its content type and encoding, headers and :data:`KEPT_PROPERTIES`; the original
    routing key travels in a header (see :func:`original_routing_key`) and the
    republish count (see :func:`republish_count`) goes up by one.
    """
    headers = dict(message.headers or {})
    headers[ORIGINAL_ROUTING_KEY] = original_routing_key(message)
    count = republish_count(message) + 1
    headers[REPUBLISH_COUNT] = count
    props = message.properties or {}
    options: dict[str, Any] = {k: props[k] for k in KEPT_PROPERTIES if props.get(k) is not None}
    options.update(headers=headers, content_type=message.content_type or "application/octet-stream",
                   content_encoding=message.content_encoding or "binary")
    return body_as_it_came(message), options, count
