"""AMQP 0-9-1 content headers as bytes: basic properties and header tables read and rebuilt, decoded only on demand."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Optional, Union

__all__ = [
    "PROPERTIES",
    "WireError",
    "Nested",
    "Properties",
    "read_properties",
    "write_properties",
    "read_table",
    "write_table",
    "decode",
    "encode",
    "item_end",
    "normal_form",
    "Unencodable",
    "py_value",
    "py_table",
    "py_property",
]

# The relay passes messages on. Decoding every header and encoding it again changes types
# (py-amqp reads a ``float`` and writes a ``double``), fails on what one client cannot represent
# (a timestamp past the year 9999, a table nested 2,000 deep) and costs time. Here a header table
# stays a list of ``(name, encoded value)`` pairs: headers are removed or added without touching
# the others, and nothing recurses, whatever the nesting. No kombu, no I/O.

#: The basic class's properties in wire order: (name, flag bit, kind). Kinds: ``s`` short
#: string, ``F`` table, ``o`` octet, ``T`` 64-bit timestamp.
PROPERTIES: tuple[tuple[str, int, str], ...] = (
    ("content_type", 0x8000, "s"),
    ("content_encoding", 0x4000, "s"),
    ("application_headers", 0x2000, "F"),
    ("delivery_mode", 0x1000, "o"),
    ("priority", 0x0800, "o"),
    ("correlation_id", 0x0400, "s"),
    ("reply_to", 0x0200, "s"),
    ("expiration", 0x0100, "s"),
    ("message_id", 0x0080, "s"),
    ("timestamp", 0x0040, "T"),
    ("type", 0x0020, "s"),
    ("user_id", 0x0010, "s"),
    ("app_id", 0x0008, "s"),
    ("cluster_id", 0x0004, "s"),
)

#: Field-value types and their fixed sizes; ``S``, ``x``, ``F`` and ``A`` carry a 32-bit length.
_FIXED = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "U": 2, "I": 4, "i": 4, "f": 4,
          "l": 8, "L": 8, "d": 8, "T": 8, "D": 5, "V": 0}
_SIZED = frozenset("SxFA")
_UNPACK = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "U": ">h", "I": ">i", "i": ">I",
           "l": ">q", "L": ">q", "f": ">f", "d": ">d", "T": ">Q"}

Table = list[tuple[bytes, bytes]]


class WireError(ValueError):
    """The bytes are not a well-formed AMQP 0-9-1 content header (or field table)."""


@dataclass(frozen=True)
class Nested:
    """A table or array value left encoded (``F`` or ``A`` and its bytes)."""

    item: bytes


@dataclass
class Properties:
    """Basic properties as they travel: strings stay bytes, the header table stays encoded."""

    #: Every property but the headers: short strings as raw bytes, octets and the timestamp as ints.
    fields: dict[str, Union[bytes, int]] = field(default_factory=dict)
    #: The header table as ``(name, encoded value)`` pairs in wire order; None when absent.
    headers: Optional[Table] = None


def _need(buf: bytes, offset: int, size: int) -> None:
    if size < 0 or offset + size > len(buf):
        raise WireError(f"truncated: {size} byte(s) wanted at offset {offset} of {len(buf)}")


#: Byte value of a type letter -> the size of its value (letters with a 32-bit length: -1).
_SIZE_OF = {**{ord(k): v for k, v in _FIXED.items()}, **{ord(k): -1 for k in _SIZED}}
_LENGTH = struct.Struct(">I").unpack_from


def item_end(buf: Union[bytes, bytearray], offset: int, end: int) -> int:
    """Return where the typed value starting at ``offset`` ends (the type letter included)."""
    if offset >= end:
        raise WireError(f"a field value is missing at offset {offset}")
    size = _SIZE_OF.get(buf[offset])
    if size is None:
        raise WireError(f"unknown field type {chr(buf[offset])!r} at offset {offset}")
    if size < 0:
        if offset + 5 > end:
            raise WireError(f"a field length runs past its table at offset {offset}")
        stop = offset + 5 + _LENGTH(buf, offset + 1)[0]
    else:
        stop = offset + 1 + size
    if stop > end:
        raise WireError(f"a field value runs past its table (offset {stop} > {end})")
    return stop


def read_table(buf: bytes, offset: int = 0, end: Optional[int] = None) -> Table:
    """Split a field table's contents (no length prefix) into ``(name, encoded value)`` pairs."""
    end = len(buf) if end is None else end
    items: Table = []
    while offset < end:
        start = offset + 1 + buf[offset]
        if start > end:
            raise WireError(f"a header name runs past its table at offset {offset}")
        stop = item_end(buf, start, end)
        items.append((bytes(buf[offset + 1:start]), bytes(buf[start:stop])))
        offset = stop
    return items


def write_table(items: Table) -> bytes:
    """Return a field table's contents (no length prefix) from ``(name, encoded value)`` pairs."""
    out = []
    for name, item in items:
        if len(name) > 255:
            raise WireError(f"header name of {len(name)} bytes (at most 255)")
        out.append(bytes((len(name),)) + name + item)
    return b"".join(out)


def read_properties(raw: bytes) -> Properties:
    """Parse the property flags and list of a basic content header (after its 12-byte prefix).

    Raises:
        WireError: the bytes are not a well-formed property list.
    """
    _need(raw, 0, 2)
    (flags,) = struct.unpack_from(">H", raw, 0)
    if flags & 0x0003:
        raise WireError(f"property flags {flags:#06x} use bits the basic class does not define")
    props = Properties()
    offset = 2
    for name, bit, kind in PROPERTIES:
        if not flags & bit:
            continue
        if kind == "s":
            _need(raw, offset, 1)
            size = raw[offset]
            _need(raw, offset + 1, size)
            props.fields[name] = bytes(raw[offset + 1:offset + 1 + size])
            offset += 1 + size
        elif kind == "o":
            _need(raw, offset, 1)
            props.fields[name] = raw[offset]
            offset += 1
        elif kind == "T":
            _need(raw, offset, 8)
            (props.fields[name],) = struct.unpack_from(">Q", raw, offset)
            offset += 8
        else:
            _need(raw, offset, 4)
            (size,) = struct.unpack_from(">I", raw, offset)
            _need(raw, offset + 4, size)
            props.headers = read_table(raw, offset + 4, offset + 4 + size)
            offset += 4 + size
    if offset != len(raw):
        raise WireError(f"{len(raw) - offset} byte(s) after the last property")
    return props


def write_properties(props: Properties) -> bytes:
    """Encode ``props`` as the property flags and list of a basic content header.

    Raises:
        WireError: a short string is over 255 bytes, or a value is out of range.
    """
    flags = 0
    chunks = []
    for name, bit, kind in PROPERTIES:
        if kind == "F":
            if props.headers is None:
                continue
            table = write_table(props.headers)
            chunks.append(struct.pack(">I", len(table)) + table)
        else:
            value = props.fields.get(name)
            if value is None:
                continue
            if kind == "s":
                if not isinstance(value, bytes) or len(value) > 255:
                    raise WireError(f"property {name} must be a short string of at most 255 bytes")
                chunks.append(bytes((len(value),)) + value)
            elif kind == "o":
                if not isinstance(value, int) or not 0 <= value <= 255:
                    raise WireError(f"property {name} must be an octet, not {value!r}")
                chunks.append(bytes((value,)))
            else:
                if not isinstance(value, int) or not 0 <= value < 2**64:
                    raise WireError(f"property {name} must be an unsigned 64-bit integer, not {value!r}")
                chunks.append(struct.pack(">Q", value))
        flags |= bit
    return struct.pack(">H", flags) + b"".join(chunks)


def decode(item: bytes) -> Any:
    """Decode one encoded value leniently, without recursing.

    Strings come back as str when they are UTF-8 and as bytes otherwise, a
    timestamp as its integer epoch seconds, a table or array as :class:`Nested`.

    Raises:
        WireError: the value is malformed.
    """
    if not item:
        raise WireError("empty field value")
    kind = chr(item[0])
    if item_end(item, 0, len(item)) != len(item):
        raise WireError(f"trailing bytes after a {kind!r} value")
    if kind in "FA":
        return Nested(item)
    if kind == "S":
        try:
            return item[5:].decode("utf-8")
        except UnicodeDecodeError:
            return item[5:]
    if kind == "x":
        return item[5:]
    if kind == "t":
        return bool(item[1])
    if kind == "V":
        return None
    if kind == "D":
        scale, value = struct.unpack_from(">Bi", item, 1)
        return Decimal(value).scaleb(-scale)
    (value,) = struct.unpack_from(_UNPACK[kind], item, 1)
    return value


def encode(value: Union[str, bytes, int]) -> bytes:
    """Encode a header value of our own: text as ``S``, bytes as ``x``, an integer as ``l``."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
        return b"S" + struct.pack(">I", len(data)) + data
    if isinstance(value, bytes):
        return b"x" + struct.pack(">I", len(value)) + value
    if isinstance(value, int) and not isinstance(value, bool):
        return b"l" + struct.pack(">q", value)
    raise TypeError(f"cannot encode a header value of type {type(value).__name__}")


_LONG, _SIGNED_LONG = ord("L"), ord("l")


def _sign_longs(item: bytes) -> bytes:
    """``item`` with every ``L`` (64-bit integer) type letter written ``l``, at any depth, without recursing."""
    if _LONG not in item:
        return item
    out = bytearray(item)
    frames = [(0, len(out), False)]  # (offset, end, inside a table: names before values)
    while frames:
        offset, end, in_table = frames.pop()
        while offset < end:
            if in_table:
                offset += 1 + out[offset]
            stop = item_end(out, offset, end)
            kind = out[offset]
            if kind == _LONG:
                out[offset] = _SIGNED_LONG
            elif kind in b"FA":
                frames.append((stop, end, in_table))
                frames.append((offset + 5, stop, kind == ord("F")))
                break
            offset = stop
    return bytes(out)


def normal_form(raw: bytes) -> Optional[bytes]:
    """Return what every copy of the property list ``raw`` that a broker hands back has in common.

    RabbitMQ 3.x returns (``basic.return``) the very bytes that were published;
    RabbitMQ 4.x re-encodes the header table: its top-level names sorted, the
    first of two equal names kept, and a 64-bit integer's type letter ``L``
    written ``l`` at any depth. This form is the same for the published bytes
    and for either broker's returned copy. None when ``raw`` is not a
    well-formed property list.
    """
    try:
        props = read_properties(raw)
        if props.headers is not None:
            first: dict[bytes, bytes] = {}
            for name, item in props.headers:
                first.setdefault(name, item)
            props.headers = [(name, _sign_longs(first[name])) for name in sorted(first)]
        return write_properties(props)
    except WireError:
        return None


# -- Python values to bytes, as py-amqp writes them -------------------------------------------
# A delayed publish hands py-amqp its properties already encoded (see kombu_ladder/producer.py).
# These functions write exactly the bytes py-amqp's own encoder (amqp.serialization) writes, for
# the types a publisher's headers hold; for anything else they raise Unencodable and the caller
# lets py-amqp encode the message, errors and all.

_U16 = struct.Struct(">H").pack
_U32 = struct.Struct(">I").pack
_I32 = struct.Struct(">i").pack
_I64 = struct.Struct(">q").pack
_U64 = struct.Struct(">Q").pack
_F64 = struct.Struct(">d").pack

#: The range py-amqp writes as a 32-bit ``I``; outside it an ``L`` (its bounds are symmetric).
_I32_MAX = 2147483647


class Unencodable(Exception):
    """A value :func:`py_value` does not write the way py-amqp would (its type, or its size)."""


def py_value(value: Any) -> bytes:
    """Return ``value`` as a typed field value, byte for byte as py-amqp writes it.

    Exact ``str``, ``bytes``, ``bool``, ``int``, ``float``, ``None``, ``dict``,
    ``list`` and ``tuple`` values, nested as py-amqp nests them (recursively), are
    written here.

    Raises:
        Unencodable: any other type (subclasses, ``Decimal``, ``datetime``, ...),
            a table name over 255 bytes or an integer beyond 64 bits.
    """
    kind = type(value)
    if kind is str:
        data = value.encode("utf-8", "surrogatepass")
        return b"S" + _U32(len(data)) + data
    if kind is int:
        if -_I32_MAX <= value <= _I32_MAX:
            return b"I" + _I32(value)
        if -2**63 <= value < 2**63:
            return b"L" + _I64(value)
        raise Unencodable("an integer beyond 64 bits")
    if value is None:
        return b"V"
    if kind is bool:
        return b"t\x01" if value else b"t\x00"
    if kind is dict:
        table = py_table(value)
        return b"F" + _U32(len(table)) + table
    if kind is list or kind is tuple:
        items = b"".join([py_value(item) for item in value])
        return b"A" + _U32(len(items)) + items
    if kind is bytes:
        return b"S" + _U32(len(value)) + value
    if kind is float:
        return b"d" + _F64(value)
    raise Unencodable(f"a value of type {kind.__name__}")


def py_table(mapping: Any) -> bytes:
    """Return a dict's field table contents (no length prefix), byte for byte as py-amqp writes them.

    Raises:
        Unencodable: as :func:`py_value`; also a name that is not ``str`` or ``bytes``.
    """
    out = []
    for name, value in mapping.items():
        kind = type(name)
        if kind is str:
            name = name.encode("utf-8", "surrogatepass")
        elif kind is not bytes:
            raise Unencodable(f"a table name of type {kind.__name__}")
        if len(name) > 255:
            raise Unencodable("a table name over 255 bytes")
        out.append(bytes((len(name),)) + name + py_value(value))
    return b"".join(out)


#: Property name -> its kind (see :data:`PROPERTIES`).
_KIND = {name: kind for name, _, kind in PROPERTIES}


def py_property(name: str, value: Any) -> bytes:
    """Return the basic property ``name``'s value encoded, byte for byte as py-amqp writes it
    (its header table excepted: see :func:`py_table`).

    Raises:
        Unencodable: a value of a type or size py-amqp would reject or write differently.
    """
    kind = _KIND[name]
    kind_of = type(value)
    if kind == "s":
        if kind_of is str:
            value = value.encode("utf-8", "surrogatepass")
        elif kind_of is not bytes:
            raise Unencodable(f"property {name} of type {kind_of.__name__}")
        if len(value) > 255:
            raise Unencodable(f"property {name} over 255 bytes")
        return bytes((len(value),)) + value
    if kind_of is not int or kind == "F":
        raise Unencodable(f"property {name} of type {kind_of.__name__}")
    if kind == "o":
        if not 0 <= value <= 255:
            raise Unencodable(f"property {name} out of an octet's range")
        return bytes((value,))
    if not 0 <= value < 2**64:
        raise Unencodable(f"property {name} out of an unsigned 64-bit range")
    return _U64(value)
