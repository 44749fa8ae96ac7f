"""Untrusted JSON records read from a stream: what every record format reads the same way (pure: no I/O)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["load_object", "millis"]


def load_object(body: Any, *, max_bytes: int, error: type[Exception]) -> dict[str, Any]:
    """The JSON object a record's body holds (bytes; a str, as py-amqp decodes a body it has an encoding for).

    Raises:
        error: the body is too big, not UTF-8 JSON, or not a JSON object; the message says which.
    """
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise error(f"its body is a {type(body).__name__}, not bytes")
    if len(body) > max_bytes:
        raise error(f"it is {len(body)} bytes, more than {max_bytes}")
    try:
        record = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise error(f"its body is not UTF-8 JSON: {type(exc).__name__}") from None
    if not isinstance(record, dict):
        raise error("its body is not a JSON object")
    return record


def millis(value: Any, field: str, *, error: type[Exception]) -> int:
    """``value`` if it is epoch milliseconds (a non-negative integer below 2**53, not a bool).

    Raises:
        error: it is not, naming ``field``.
    """
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 53:
        raise error(f"field {field!r} must be epoch milliseconds (a non-negative integer), not {value!r:.40}")
    return value
