"""A message's body and headers as the console shows them: decoded where safe, size-capped (pure: no I/O).

Everything here is untrusted text from a message. It is returned as plain ``str``
(the templates escape it); control and bidi characters are made visible, so a
header cannot rewrite the page's text direction or hide in a terminal escape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..text import escape

__all__ = ["PREVIEW_BYTES", "DECODE_BYTES", "Preview", "preview", "header_rows", "shown"]

#: Bytes of a body the preview shows at most.
PREVIEW_BYTES = 4096
#: The largest body decoded as JSON (a larger one is shown as text, cut).
DECODE_BYTES = 256 * 1024
#: Characters of one header value shown at most.
HEADER_TEXT = 500

_JSON = ("application/json", "application/x-json")


@dataclass(frozen=True)
class Preview:
    """What the console shows of a body."""

    #: How it was read: ``json``, ``celery`` (args/kwargs of a Celery task), ``text``, ``binary`` or ``compressed``.
    kind: str
    #: The body's size in bytes, and whether the preview shows less than all of it.
    size: int
    truncated: bool
    #: The preview itself (text, pretty JSON, or a hex dump).
    text: str
    #: A Celery task's positional and keyword arguments, pretty-printed (``kind == "celery"``).
    args: Optional[str] = None
    kwargs: Optional[str] = None
    #: Notes for the reader (why it was not decoded, what was cut).
    notes: tuple[str, ...] = field(default_factory=tuple)


def shown(value: Any, *, limit: int = HEADER_TEXT) -> str:
    """One value as safe plain text: bytes decoded, control and bidi characters escaped, cut to ``limit``."""
    if isinstance(value, (dict, list, tuple)):
        try:
            value = json.dumps(value, ensure_ascii=False, default=repr, sort_keys=True)
        except (TypeError, ValueError):
            value = repr(value)
    elif not isinstance(value, (str, bytes, bytearray, memoryview)):
        value = repr(value)
    return escape(value, limit=limit)


def _pretty(data: Any, limit: int) -> tuple[str, bool]:
    text = json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True, default=repr)
    return _lines(text, limit), len(text) > limit


def _hexdump(data: bytes) -> str:
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at:at + 16]
        printable = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{at:08x}  {chunk.hex(' '):<47}  {printable}")
    return "\n".join(lines)


def _lines(text: str, limit: int) -> str:
    """Text cut to ``limit`` characters, every line's non-printable characters escaped, newlines kept."""
    return "\n".join(escape(line, limit=limit) for line in text[:limit].split("\n"))


def preview(body: bytes, *, content_type: Optional[str], content_encoding: Optional[str],
            headers: Mapping[str, Any], limit: int = PREVIEW_BYTES) -> Preview:
    """What to show of ``body``: a Celery task's args and kwargs when it is one (protocol 2, JSON), pretty JSON,
    UTF-8 text, or a hex dump; never more than ``limit`` bytes of it, and never inflated when compressed."""
    size = len(body)
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if headers.get("compression"):
        return Preview("compressed", size, True, _hexdump(body[:min(limit, 256)]),
                       notes=(f"compressed ({shown(headers.get('compression'), limit=40)}): not inflated",))
    encoding = (content_encoding or "utf-8").lower()
    if ctype in _JSON and size <= DECODE_BYTES and encoding in ("utf-8", "utf8"):
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            data = None
        else:
            if "task" in headers and "id" in headers and isinstance(data, list) and len(data) == 3 \
                    and isinstance(data[0], list) and isinstance(data[1], dict):
                args, cut_a = _pretty(data[0], limit)
                kwargs, cut_k = _pretty(data[1], limit)
                return Preview("celery", size, cut_a or cut_k, _lines(body.decode("utf-8"), limit), args=args,
                               kwargs=kwargs)
            text, cut = _pretty(data, limit)
            return Preview("json", size, cut, text)
    if encoding in ("utf-8", "utf8", "binary") or ctype.startswith("text/") or ctype in _JSON:
        try:
            text = body[:limit].decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < limit - 4:  # not a character cut in two at the limit
                return Preview("binary", size, size > limit, _hexdump(body[:limit]),
                               notes=("not UTF-8 text: shown as bytes",))
            text = body[:exc.start].decode("utf-8")
        return Preview("text", size, size > limit, _lines(text, limit))
    return Preview("binary", size, size > limit, _hexdump(body[:limit]),
                   notes=(f"content encoding {shown(content_encoding, limit=40)}: shown as bytes",))


def header_rows(headers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``headers`` as sorted (name, value) rows of safe text."""
    rows = [(shown(name, limit=120), shown(value)) for name, value in headers.items()]
    return sorted(rows)
