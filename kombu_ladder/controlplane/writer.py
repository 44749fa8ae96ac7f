"""The one writer of control records: bodies published to their kind's exchange, confirms pipelined."""

from __future__ import annotations

from typing import Any, Sequence

from ..carry import confirming
from ..link import close_quietly, drain_until
from .codec import Record, encode, kind_of
from .table import KINDS

__all__ = ["WriteRefused", "write_records", "write_bodies", "CONFIRM_TIMEOUT"]

#: Seconds the records of one call may take to be confirmed, all together.
CONFIRM_TIMEOUT = 60.0


class WriteRefused(Exception):
    """The broker nacked or returned a record, or did not confirm them in time (the message says which)."""


def _exchange_of(record: Record) -> str:
    """The exchange of ``record``'s kind (the table's)."""
    name = kind_of(record)
    return next(k.exchange for k in KINDS if k.name == name)


def write_records(connection: Any, records: Sequence[Record], stream: str, *,
                  timeout: float = CONFIRM_TIMEOUT) -> None:
    """Encode ``records`` and publish each to its kind's exchange, routed to ``stream``: see :func:`write_bodies`."""
    if records:
        write_bodies(connection, _exchange_of(records[0]), stream, [encode(r) for r in records], timeout=timeout)


def write_bodies(connection: Any, exchange: str, stream: str, bodies: Sequence[bytes], *,
                 timeout: float = CONFIRM_TIMEOUT) -> None:
    """Publish ``bodies`` to ``exchange`` (routing key ``stream``) on a confirming channel of their own, mandatory
    and persistent, confirms pipelined: all are sent, then their confirms waited for together.

    Raises:
        WriteRefused: the broker nacked or returned a record, or did not confirm them all in ``timeout`` seconds.
        the connection's channel errors: the broker closed the channel (403: not this user's to write; 404: no
            such exchange).
    """
    if not bodies:
        return
    acked, refused = [0], []

    def on_ack(tag: int, multiple: bool) -> None:
        acked[0] = max(acked[0], tag)

    def on_nack(tag: int, multiple: bool) -> None:
        refused.append(f"nacked (delivery tag {tag})")
        on_ack(tag, multiple)

    def on_return(exc: Any, returned_by: str, routing_key: str, message: Any) -> None:
        refused.append(f"returned by {returned_by!r}: {getattr(exc, 'reply_text', exc)}")

    channel = confirming(connection.channel(), on_ack=on_ack, on_nack=on_nack, on_return=on_return)
    try:
        for body in bodies:
            message = channel.prepare_message(body, content_type="application/json", content_encoding="utf-8",
                                              properties={"delivery_mode": 2})
            type(channel).basic_publish(channel, message, exchange=exchange, routing_key=stream, mandatory=True)
        if not drain_until(connection, lambda: acked[0] >= len(bodies), timeout):
            raise WriteRefused(f"the broker did not confirm {len(bodies) - acked[0]} record(s) for {stream} "
                               f"within {timeout:g} s")
        if refused:
            raise WriteRefused(f"the broker refused records for {stream} ({'; '.join(refused[:3])})")
    finally:
        close_quietly(channel)
