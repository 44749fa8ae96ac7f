"""What the AMQP wire does to a message: properties and tables as py-amqp encodes and decodes them."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from amqp.basic_message import Message as AmqpMessage
from amqp.serialization import _read_item, _write_table, decode_properties_basic

__all__ = ["PROPERTY_NAMES", "round_trip_properties", "round_trip_table", "copy_decoded", "body_bytes", "client_body"]

#: The AMQP basic properties, in py-amqp's order.
PROPERTY_NAMES: tuple[str, ...] = tuple(name for name, _ in AmqpMessage.PROPERTIES)


def round_trip_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Encode ``properties`` as py-amqp sends them and decode them as py-amqp reads them.

    Header values come back with the types a real consumer sees (bytes as
    str, tuples as lists, datetimes truncated to the second); a value py-amqp
    cannot send raises the same error it raises on a real connection.
    """
    # Like py-amqp, anything that is not an AMQP property is not sent at all.
    known = {k: v for k, v in properties.items() if k in PROPERTY_NAMES and v is not None}
    raw = AmqpMessage(**known)._serialize_properties()
    decoded, _ = decode_properties_basic(raw, 0)
    return decoded


def copy_decoded(value: Any) -> Any:
    """Return an independent copy of what :func:`round_trip_properties` returned.

    Decoded values are only tables, arrays and immutable scalars, so copying
    the containers is enough; much cheaper than another round trip.
    """
    if isinstance(value, dict):
        return {k: copy_decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_decoded(v) for v in value]
    return value


def round_trip_table(table: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Encode and decode an AMQP field table (queue, binding or consumer arguments)."""
    if not table:
        return {}
    chunks: list[bytes] = []
    _write_table(dict(table), chunks.append, [])
    value, _ = _read_item(b"F" + b"".join(chunks), 0)
    return value


def body_bytes(body: Union[bytes, bytearray, memoryview, str], properties: dict[str, Any]) -> bytes:
    """Return the bytes py-amqp would put on the wire for ``body`` (a str is encoded)."""
    if isinstance(body, str):
        encoding = properties.setdefault("content_encoding", "utf-8")
        return body.encode(encoding)
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"message body must be bytes or str, not {type(body).__name__}")


def client_body(body: bytes, properties: Mapping[str, Any]) -> Union[bytes, str]:
    """Return the body as a py-amqp channel hands it over (``auto_decode``).

    py-amqp decodes the body with its ``content_encoding`` when it can, and
    leaves the bytes alone otherwise (``binary``, no encoding, or undecodable).
    """
    encoding = properties.get("content_encoding")
    if encoding:
        try:
            return body.decode(encoding)
        except Exception:  # noqa: BLE001 - exactly py-amqp's own fallback
            return body
    return body
