"""The one place the relay's bytes are built: what arrived, with headers removed and added only (no I/O)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

from .. import wire
from ..carry import CARRIED_PROPERTIES
from ..contract import DUE_AT, MESSAGE_TYPE, PARKED_AT, PARKED_REASON, SCHEDULE_HEADERS
from ..envelope import (
    DEATH_HEADER,
    DEATH_PREFIXES,
    LOCAL_HEADERS,
    REFUSALS,
    delivered_content_type,
    delivered_mode,
)
from ..parking import PARKED_ID, RAW_PROPERTIES

__all__ = ["Headers", "views", "twice", "encode", "refusals"]

#: Headers a delivery never carries: the schedule's, this library's local ones.
_NOT_DELIVERED = frozenset((*SCHEDULE_HEADERS, *LOCAL_HEADERS))
#: Headers the relay reads; one of them given twice is ambiguous (which one would another relay read?).
_READ = (*SCHEDULE_HEADERS, *LOCAL_HEADERS)
#: Headers a park writes (and so removes first, should a message carry them already).
_PARKING = frozenset((PARKED_REASON, PARKED_AT, PARKED_ID))
#: Properties never republished: a parked message must not expire, and RabbitMQ refuses a
#: ``user_id`` other than the relay's own (406, which closes the channel).
_NEVER = frozenset(("expiration", "user_id"))


def _name(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


class Headers(Mapping[str, Any]):
    """A header table's top level, each value decoded when first looked at (tables and arrays stay
    encoded, as :class:`~kombu_ladder.wire.Nested`); a name given twice holds its last value, as
    py-amqp reads it."""

    __slots__ = ("_items", "_decoded")

    def __init__(self, table: wire.Table) -> None:
        self._items = {_name(n): item for n, item in table}
        self._decoded: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        try:
            return self._decoded[key]
        except KeyError:
            value = self._decoded[key] = wire.decode(self._items[key])
            return value

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def views(props: wire.Properties) -> tuple[Optional[Headers], dict[str, Any]]:
    """Return the headers (see :class:`Headers`) and the other properties as plain values.

    Call only on properties :func:`kombu_ladder.readable.problem` accepted: their
    strings are UTF-8.
    """
    headers = None if props.headers is None else Headers(props.headers)
    fields = {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in props.fields.items()}
    return headers, fields


def twice(props: wire.Properties, headers: Optional[Headers]) -> Optional[str]:
    """Name a header the relay reads that the message carries more than once, or return None."""
    if headers is None or props.headers is None or len(headers) == len(props.headers):
        return None
    counts = Counter(_name(n) for n, _ in props.headers)
    return next((name for name in _READ if counts[name] > 1), None)


def _without(items: Optional[wire.Table], names: frozenset[bytes]) -> Optional[wire.Table]:
    """``items`` without the headers named in ``names`` and without the death headers."""
    if items is None:
        return None
    return [(n, item) for n, item in items if n not in names and not _death(n)]


def _death(name: bytes) -> bool:
    return name == _DEATH or name.startswith(_DEATH_PREFIXES)


_DEATH = DEATH_HEADER.encode()
_DEATH_PREFIXES = tuple(prefix.encode() for prefix in DEATH_PREFIXES)
_NONE: frozenset[bytes] = frozenset()
_NOT_DELIVERED_B = frozenset(n.encode() for n in _NOT_DELIVERED)
_RETRIED_B = frozenset((DUE_AT.encode(), REFUSALS.encode()))
_PARKING_B = frozenset(n.encode() for n in _PARKING)
_RAW_PROPERTIES = RAW_PROPERTIES.encode()


#: The headers each kind of publish drops (besides the death headers, which none carries on).
_DROPPED = {"deliver": _NOT_DELIVERED_B, "hop": _NONE, "retry": _RETRIED_B, "park": _PARKING_B}
_SCHEDULED = MESSAGE_TYPE.encode()
_NO_HEADERS: Mapping[str, Any] = {}


def encode(kind: str, props: Optional[wire.Properties], headers: Mapping[str, Any] = _NO_HEADERS, *,
           raw: bytes = b"", added: Sequence[tuple[str, Any]] = ()) -> bytes:
    """The encoded properties of what the relay publishes for a message that arrived with ``props``.

    * ``"deliver"``: the carried properties, the content type and delivery mode the publisher
      chose (read from ``headers``, the message's header view), and every header but the
      schedule's, the local and the death headers.
    * ``"hop"``: the carried properties as a persistent ``ScheduledMessage``, every header but
      the death headers.
    * ``"retry"``: a hop of a refused delivery, whose ``added`` headers (due time, refusals)
      replace those it carried.
    * ``"park"``: every property but ``expiration`` and ``user_id`` (a parked message never
      expires; RabbitMQ refuses another user's id), persistent, the headers but the death headers,
      plus the ``added`` parking headers (why, when, a parking id). Properties no client could read
      (``props`` None, or properties that cannot be written again) travel as they arrived: as bytes,
      ``raw``, in ``x-ladder-raw-properties``.

    ``added`` are (header name, value) pairs, appended in order.
    """
    if props is None:
        fields: dict[str, Any] = {}
        kept: Optional[wire.Table] = []
    elif kind == "park":
        fields = {k: v for k, v in props.fields.items() if k not in _NEVER}
        kept = _without(props.headers, _DROPPED[kind])
    else:
        fields = {k: v for k, v in props.fields.items() if k in CARRIED_PROPERTIES}
        kept = _without(props.headers, _DROPPED[kind])
        own = props.fields.get("type")
        if kind != "deliver":
            fields["type"] = _SCHEDULED
        elif own is not None and own != _SCHEDULED:
            fields["type"] = own
    if kind == "deliver":
        fields["delivery_mode"] = delivered_mode(headers)
        content_type = delivered_content_type(headers)
        if content_type is not None:
            fields["content_type"] = content_type.encode("utf-8")
    else:
        fields["delivery_mode"] = 2
    notes = [(name.encode(), wire.encode(value)) for name, value in added]
    if props is None:
        notes.append((_RAW_PROPERTIES, wire.encode(raw)))
    if notes:
        kept = [*(kept or ()), *notes]
    try:
        return wire.write_properties(wire.Properties(fields, kept))
    except wire.WireError:
        if kind != "park" or props is None:
            raise
        # properties that cannot be written again are parked as the bytes they arrived as
        notes.append((_RAW_PROPERTIES, wire.encode(raw)))
        return wire.write_properties(wire.Properties({"delivery_mode": 2}, notes))


def refusals(headers: Optional[Mapping[str, Any]]) -> int:
    """How many times the broker refused to take this message before (``x-ladder-refusals``)."""
    value = (headers or {}).get(REFUSALS)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
