"""The encoded properties of what the relay publishes: what arrived, with headers removed and added only (no I/O)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from .. import wire
from ..carry import CARRIED_PROPERTIES
from ..contract import DUE_AT, MESSAGE_TYPE, PARKED_AT, PARKED_REASON, SCHEDULE_HEADERS
from ..envelope import (
    LOCAL_HEADERS,
    REFUSALS,
    delivered_content_type,
    delivered_mode,
)
from ..parking import PARKED_ID, RAW_PROPERTIES

__all__ = ["Headers", "views", "twice", "delivery", "hop", "retry", "park", "quarantine", "refusals"]

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
    return name == b"x-death" or name.startswith(_DEATH_PREFIXES)


_DEATH_PREFIXES = (b"x-first-death-", b"x-last-death-")
_NONE: frozenset[bytes] = frozenset()
_NOT_DELIVERED_B = frozenset(n.encode() for n in _NOT_DELIVERED)
_RETRIED_B = frozenset((DUE_AT.encode(), REFUSALS.encode()))
_PARKING_B = frozenset(n.encode() for n in _PARKING)


def _carried(props: wire.Properties) -> dict[str, Any]:
    return {k: v for k, v in props.fields.items() if k in CARRIED_PROPERTIES}


def delivery(props: wire.Properties, headers: Mapping[str, Any]) -> bytes:
    """What a delivery carries: the carried properties, the content type and delivery mode the
    publisher chose, and every header but the schedule's, the local and the death headers."""
    fields = _carried(props)
    content_type = delivered_content_type(headers)
    if content_type is not None:
        fields["content_type"] = content_type.encode("utf-8")
    fields["delivery_mode"] = delivered_mode(headers)
    kind = props.fields.get("type")
    if kind is not None and kind != MESSAGE_TYPE.encode():
        fields["type"] = kind
    kept = _without(props.headers, _NOT_DELIVERED_B)
    return wire.write_properties(wire.Properties(fields, kept))


def hop(props: wire.Properties) -> bytes:
    """What goes back into a rung: the carried properties as a persistent ``ScheduledMessage``,
    every header but the death headers."""
    fields = _carried(props)
    fields["type"] = MESSAGE_TYPE.encode()
    fields["delivery_mode"] = 2
    return wire.write_properties(wire.Properties(fields, _without(props.headers, _NONE)))


def retry(props: wire.Properties, *, due_at: int, refusals: int) -> bytes:
    """A refused delivery sent back into a rung, due again at ``due_at`` (epoch ms), refused ``refusals`` times."""
    fields = _carried(props)
    fields["type"] = MESSAGE_TYPE.encode()
    fields["delivery_mode"] = 2
    kept = _without(props.headers, _RETRIED_B) or []
    kept += [(DUE_AT.encode(), wire.encode(due_at)), (REFUSALS.encode(), wire.encode(refusals))]
    return wire.write_properties(wire.Properties(fields, kept))


def _parking_headers(reason: str, at: int, park_id: str) -> wire.Table:
    return [(PARKED_REASON.encode(), wire.encode(reason)), (PARKED_AT.encode(), wire.encode(at)),
            (PARKED_ID.encode(), wire.encode(park_id))]


def park(props: wire.Properties, *, reason: str, at: int, park_id: str) -> bytes:
    """A parked message: its properties (persistent, never expiring), its headers but the death
    headers, plus why (``x-ladder-parked-reason``), when and a parking id."""
    fields = {k: v for k, v in props.fields.items() if k not in _NEVER}
    fields["delivery_mode"] = 2
    kept = _without(props.headers, _PARKING_B) or []
    return wire.write_properties(wire.Properties(fields, kept + _parking_headers(reason, at, park_id)))


def quarantine(raw: bytes, *, reason: str, at: int, park_id: str) -> bytes:
    """A parked message whose properties no client could read: they travel as they arrived, as
    bytes in ``x-ladder-raw-properties``, beside the parking headers."""
    headers = _parking_headers(reason, at, park_id) + [(RAW_PROPERTIES.encode(), wire.encode(raw))]
    return wire.write_properties(wire.Properties({"delivery_mode": 2}, headers))


def refusals(headers: Optional[Mapping[str, Any]]) -> int:
    """How many times the broker refused to take this message before (``x-ladder-refusals``)."""
    value = (headers or {}).get(REFUSALS)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
