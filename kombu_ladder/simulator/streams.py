"""Streams in the simulator: an append-only log that every consumer reads from its own offset."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Optional

from amqp import spec
from amqp.exceptions import PreconditionFailed

from .. import wire
from .entities import ConsumerRef, SimQueue, Stored

__all__ = ["is_stream", "check_declare", "start_offset", "append", "dispatch"]

#: What this model leaves out: retention (``x-max-age``, ``x-max-length-bytes``) keeps every
#: record; a timestamp offset starts at the first record appended in or after its second (RabbitMQ
#: starts at the chunk holding it, which may be a few records earlier); ``basic.get`` is not refused.


def is_stream(queue: SimQueue) -> bool:
    """Whether ``queue`` was declared with ``x-queue-type=stream``."""
    return queue.arguments.get("x-queue-type") == "stream"


def check_declare(name: str, vhost: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                  arguments: dict[str, Any]) -> None:
    """Refuse a stream declaration RabbitMQ refuses: it must be durable, neither exclusive nor auto-delete."""
    if arguments.get("x-queue-type") != "stream":
        return
    for flag, value, wanted in (("durable", durable, True), ("exclusive", exclusive, False),
                                ("auto-delete", auto_delete, False)):
        if bool(value) is not wanted:
            raise PreconditionFailed(f"PRECONDITION_FAILED - invalid property '{flag}' for queue '{name}' in "
                                     f"vhost '{vhost}'", spec.Queue.Declare, reply_code=406)


def start_offset(queue: SimQueue, arguments: Optional[dict[str, Any]]) -> int:
    """Where a new consumer of the stream ``queue`` starts (``x-stream-offset``; default ``next``)."""
    offset = (arguments or {}).get("x-stream-offset", "next")
    if offset == "first":
        return 0
    if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
        return min(offset, len(queue.log))
    if isinstance(offset, datetime):  # an AMQP timestamp: whole seconds
        moment = offset if offset.tzinfo else offset.replace(tzinfo=timezone.utc)
        since = int(moment.timestamp()) * 1000
        return next((i for i, m in enumerate(queue.log) if (m.appended_at or 0) >= since), len(queue.log))
    if offset == "last":  # RabbitMQ starts at the last chunk; here a chunk is one record
        return max(0, len(queue.log) - 1)
    return len(queue.log)  # "next" and what is not modelled


def append(core: Any, queue: SimQueue, message: Stored) -> bool:
    """Append ``message`` to the stream's log (it never expires) and hand it to the consumers."""
    message.expires_at = None
    message.appended_at = core.clock.ms
    _number(message, len(queue.log))
    queue.log.append(message)
    if core.record:
        core._arrivals[queue.name].append((core.clock.ms, message))
    dispatch(core, queue)
    return True


def _number(message: Stored, offset: int) -> None:
    """Give ``message`` the header RabbitMQ delivers every stream record with: ``x-stream-offset``, its offset
    (a signed 64-bit integer). Properties that cannot be read are left as they are (RabbitMQ would refuse them)."""
    try:
        props = wire.read_properties(message.raw)
    except wire.WireError:
        return
    props.headers = [item for item in props.headers or [] if item[0] != b"x-stream-offset"]
    props.headers.append((b"x-stream-offset", wire.encode(offset)))
    message.raw = wire.write_properties(props)
    headers = dict(message.properties.get("application_headers") or {})
    headers["x-stream-offset"] = offset
    message.properties = {**message.properties, "application_headers": headers}


def dispatch(core: Any, queue: SimQueue) -> None:
    """Give each consumer the records past its offset, as far as its prefetch allows."""
    for ref in list(queue.consumers):
        _feed(core, queue, ref)


def _feed(core: Any, queue: SimQueue, ref: ConsumerRef) -> None:
    log = queue.log
    while ref.offset is not None and ref.offset < len(log) and ref.has_capacity() and core.is_live(queue):
        message = log[ref.offset]
        headers = {**message.headers, "x-stream-offset": ref.offset}  # as RabbitMQ tells a consumer each offset
        ref.offset += 1
        core._deliver(queue, ref, replace(message, properties={**message.properties, "application_headers": headers}))
