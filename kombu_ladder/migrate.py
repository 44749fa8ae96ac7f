"""Move the messages waiting in one broker's ladder to another's (blue-green migration)."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from kombu import Connection, Queue
from kombu.exceptions import OperationalError

from .contract import CONTROL, EXCHANGE, PARKING, rung_names
from .envelope import strip_death
from .topology import declare

__all__ = ["MoveResult", "move", "main"]

logger = logging.getLogger(__name__)

I_MOVED = "moved %d message(s) from %s"

#: AMQP properties copied onto the moved message (headers travel separately).
_PROPERTIES = (
    "content_type", "content_encoding", "correlation_id", "reply_to", "message_id",
    "priority", "timestamp", "type", "app_id", "cluster_id", "delivery_mode",
)


@dataclass(frozen=True)
class MoveResult:
    """What :func:`move` did: messages moved per source queue."""

    moved: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Messages moved from every queue together."""
        return sum(self.moved.values())


def move(source: Connection, target: Connection, *, limit: Optional[int] = None,
         include_parked: bool = True) -> MoveResult:
    """Move every message waiting in ``source``'s ladder into ``target``'s.

    Each rung and the control queue are emptied into ``target``'s
    ``acemq.schedule`` exchange with the routing key ``acemq.schedule.due``:
    ``target``'s relay then reads each message's ``x-schedule-due-at`` and puts
    it into the right rung, or delivers it when it is due, so no due time
    changes. Parked messages go to ``target``'s parking queue, unchanged.

    Body, properties and application headers are copied unchanged (minus
    RabbitMQ's ``x-death`` bookkeeping). Each message is acked on ``source``
    only after ``target`` confirmed it: a crash can duplicate a message, never
    lose one. Each queue is moved up to the depth it had when its turn came, so
    a source that still has producers or a relay does not keep the move going.

    Arguments:
        source: the broker to empty (the "blue" one).
        target: the broker to fill (the "green" one); its topology is declared.
        limit: move at most this many messages per queue.
        include_parked: also move ``acemq.schedule.parked``.

    Returns:
        A :class:`MoveResult`.

    Raises:
        ValueError: ``limit`` is not a positive integer.
        amqp.exceptions.MessageNacked: ``target`` refused a message; it stays on ``source``.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, not {limit!r}")
    declare(target)
    queues = [*rung_names(), CONTROL] + ([PARKING] if include_parked else [])
    moved: dict[str, int] = {}
    out = target.channel()
    try:
        for name in queues:
            moved[name] = _move_queue(source, out, name, limit)
            if moved[name]:
                logger.info(I_MOVED, moved[name], name)
    finally:
        out.close()
    return MoveResult(moved)


def _move_queue(source: Connection, out: Any, name: str, limit: Optional[int]) -> int:
    channel = source.channel()
    try:
        try:
            _, depth, _ = channel.queue_declare(name, passive=True)
        except source.channel_errors:
            return 0  # no such queue on the source: nothing waits there
        budget = depth if limit is None else min(depth, limit)
        queue = Queue(name, no_declare=True).bind(channel)
        count = 0
        while count < budget:
            message = queue.get(no_ack=False, accept=None)
            if message is None:
                break
            _copy(out, message, parked=name == PARKING)
            message.ack()
            count += 1
        return count
    finally:
        try:
            channel.close()
        except Exception:  # noqa: BLE001 - the broker may have closed it already
            logger.debug("closing the source channel failed", exc_info=True)


def _copy(out: Any, message: Any, *, parked: bool) -> None:
    raw = message.properties or {}
    properties = {k: raw[k] for k in _PROPERTIES if raw.get(k) is not None}
    priority = properties.pop("priority", None)
    content_type = properties.pop("content_type", None)
    content_encoding = properties.pop("content_encoding", None)
    headers = strip_death(message.headers or {})
    prepared = out.prepare_message(message.body, priority, content_type, content_encoding, headers, properties)
    exchange, routing_key = ("", PARKING) if parked else (EXCHANGE, CONTROL)
    out.basic_publish_confirm(prepared, exchange=exchange, routing_key=routing_key, mandatory=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m kombu_ladder.migrate --from URL --to URL``; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m kombu_ladder.migrate", description=__doc__)
    parser.add_argument("--from", dest="source", required=True, metavar="URL", help="the broker to empty")
    parser.add_argument("--to", dest="target", required=True, metavar="URL", help="the broker to fill")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="at most N messages per queue")
    parser.add_argument("--keep-parked", action="store_true", help="leave acemq.schedule.parked where it is")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Connection(args.source, connect_timeout=5) as source, Connection(args.target, connect_timeout=5) as target:
        for conn in (source, target):
            try:
                conn.ensure_connection(max_retries=1)
            except (OperationalError, *conn.connection_errors) as exc:  # kombu wraps socket errors
                print(f"kombu_ladder.migrate: cannot reach {conn.as_uri()}: {exc}", file=sys.stderr)
                return 2
        result = move(source, target, limit=args.limit, include_parked=not args.keep_parked)
    for name, count in result.moved.items():
        print(f"{name:<26} {count:>9}")
    print(f"moved {result.total} message(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
