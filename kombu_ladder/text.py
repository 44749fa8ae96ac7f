"""Text from the broker or from a message, made safe to log and to record: escaped and bounded."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_TEXT", "escape", "quote"]

#: The most characters of one quoted value (a name, a header, a broker reply) kept in a log line or reason.
MAX_TEXT = 300


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(value: Any, *, limit: int = MAX_TEXT) -> str:
    """Return ``value`` as text with every non-printable character escaped, cut to ``limit`` characters.

    Control characters (ANSI escapes, newlines, NUL), bidi overrides and lone
    surrogates come out as ``\\x1b``, ``\\u202e``...; bytes that are not UTF-8
    are escaped byte by byte. A value cut short ends with ``...(N more)``.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes(value).decode("utf-8", "backslashreplace")
    else:
        text = value if isinstance(value, str) else str(value)
    extra = len(text) - limit
    if extra > 0:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escaped(c) for c in text)
    return f"{text}...({extra} more)" if extra > 0 else text


def quote(value: Any, *, limit: int = MAX_TEXT) -> str:
    """Return ``value`` escaped (see :func:`escape`) between single quotes, for names in messages."""
    return f"'{escape(value, limit=limit)}'"
