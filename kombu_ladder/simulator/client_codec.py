"""What the AMQP wire does to a message: properties and tables as py-amqp encodes and decodes them."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from amqp.basic_message import Message as AmqpMessage
from amqp.exceptions import FrameSyntaxError
from amqp.serialization import _read_item, _write_table, decode_properties_basic, dumps

from .. import wire

__all__ = ["PROPERTY_NAMES", "round_trip_properties", "round_trip_table", "copy_decoded", "body_bytes", "client_body",
           "decode_raw", "with_headers"]

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


def decode_raw(raw: bytes) -> tuple[dict[str, Any], Optional[BaseException]]:
    """Decode encoded properties as a py-amqp consumer would, or as RabbitMQ does when py-amqp cannot.

    RabbitMQ takes property lists py-amqp fails on (a content type that is not
    UTF-8, a timestamp header past the year 9999, a table nested 2,000 deep).
    Those come back decoded leniently (strings as bytes, tables and arrays of
    the header table as :class:`kombu_ladder.wire.Nested`), with the error
    py-amqp raises on them; the broker still routes and stores them.

    Raises:
        FrameSyntaxError: RabbitMQ itself would not parse the list (it closes the
            publisher's connection).
    """
    try:
        properties, _ = decode_properties_basic(raw, 0)
        return properties, None
    except Exception as exc:  # noqa: BLE001 - whatever py-amqp raises on it, a consumer gets
        error = exc
    try:
        parsed = wire.read_properties(raw)
    except wire.WireError as exc:
        raise FrameSyntaxError(f"INTERNAL_ERROR - cannot parse the content header: {exc}") from exc
    lenient: dict[str, Any] = {k: _lenient(v) for k, v in parsed.fields.items()}
    if parsed.headers is not None:
        lenient["application_headers"] = {_lenient(n): wire.decode(item) for n, item in parsed.headers}
    return lenient, error


def _lenient(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def with_headers(raw: bytes, headers: Mapping[str, Any], *, drop: tuple[str, ...] = ()) -> bytes:
    """Return ``raw`` with the given headers set (encoded as py-amqp encodes them) and the ``drop``
    properties removed; every other header keeps its bytes, as RabbitMQ keeps their types."""
    parsed = wire.read_properties(raw)
    for name in drop:
        parsed.fields.pop(name, None)
    new = dict(wire.read_table(dumps("F", [dict(headers)]), 4))
    table = [(n, new.pop(n, item)) for n, item in parsed.headers or ()]
    parsed.headers = table + list(new.items())
    return wire.write_properties(parsed)


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
