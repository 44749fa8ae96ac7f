"""Whether every client can read a message's properties: what the relay refuses to pass on (no I/O)."""

from __future__ import annotations

import struct
from typing import Optional

from .wire import Properties, WireError, item_end

__all__ = ["MAX_DEPTH", "problem"]

#: How deep header tables and arrays may nest in a message the relay passes on. py-amqp decodes
#: one level per stack frame; a consumer nearer its recursion limit fails long before 1,000.
MAX_DEPTH = 100

#: The latest timestamp (epoch seconds) py-amqp can turn into a datetime: 9999-12-31T23:59:59.
_LAST_TIMESTAMP = 253_402_300_799


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def problem(props: Properties, *, max_depth: int = MAX_DEPTH) -> Optional[str]:
    """Say why a consumer could not read these properties, or return None when every client can.

    Checked without recursion: property strings and header names are UTF-8,
    timestamps fall before the year 10000, tables and arrays nest at most
    ``max_depth`` deep, and every value is well formed.
    """
    try:
        return _problem(props, max_depth)
    except WireError as exc:
        return f"the header table is malformed: {exc}"


def _problem(props: Properties, max_depth: int) -> Optional[str]:
    for name, value in props.fields.items():
        if isinstance(value, bytes) and not value.isascii() and not _utf8(value):
            return f"property {name} is not valid UTF-8"
    if props.headers is None:
        return None
    # (buffer, offset, end, depth, is_table): the tables and arrays still to look through.
    stack: list[tuple[bytes, int, int, int, bool]] = []
    for key, item in props.headers:  # read_table split them: only their nested content is walked
        if not key.isascii() and not _utf8(key):
            return "a header name is not valid UTF-8"
        kind = item[0]
        if kind == _T and _timestamp(item, 1) > _LAST_TIMESTAMP:
            return "a header holds a timestamp after the year 9999"
        if kind == _F or kind == _A:
            stack.append((item, 5, len(item), 1, kind == _F))
    while stack:
        buf, offset, end, depth, is_table = stack.pop()
        if depth >= max_depth:
            return f"header tables or arrays are nested deeper than {max_depth} levels"
        while offset < end:
            if is_table:
                start = offset + 1 + buf[offset]
                if start > end:
                    raise WireError(f"a nested header name runs past its table at offset {offset}")
                if not _utf8(buf[offset + 1:start]):
                    return "a nested header name is not valid UTF-8"
                offset = start
            stop = item_end(buf, offset, end)
            kind = buf[offset]
            if kind == _T and _timestamp(buf, offset + 1) > _LAST_TIMESTAMP:
                return "a header holds a timestamp after the year 9999"
            if kind == _F or kind == _A:
                stack.append((buf, offset + 5, stop, depth + 1, kind == _F))
            offset = stop
    return None


_T, _F, _A = ord("T"), ord("F"), ord("A")
_QUAD = struct.Struct(">Q").unpack_from


def _timestamp(buf: bytes, offset: int) -> int:
    return int(_QUAD(buf, offset)[0])
