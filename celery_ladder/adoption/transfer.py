"""Moving task messages into the ladder in a transaction, and reading the adoption records back."""

from __future__ import annotations

import logging
import socket
import time
from datetime import datetime
from typing import Any, Callable, Optional

from kombu import Producer

from kombu_ladder.carry import carried
from kombu_ladder.controlplane import ADOPTED, READ_TIMEOUT
from kombu_ladder.controlplane.codec import Adoption
from kombu_ladder.controlplane.reader import StreamReader
from kombu_ladder.plan import to_millis
from kombu_ladder.producer import LadderProducer
from kombu_ladder.topology import check_writable, declare_control_plane_if_allowed

from ..publish import task_eta
from ..settings import LadderSettings
from .records import ADOPTED_HEADER, STREAM, Adopted, encode

__all__ = ["Mover", "Records", "task_due", "declare_stream", "CATCH_UP_TIMEOUT"]

logger = logging.getLogger(__name__)

#: Seconds a reader waits to read ``ladder.adoptions`` to its end (the control plane's one timeout).
CATCH_UP_TIMEOUT = READ_TIMEOUT
#: Content type of a message that has none: its bytes are copied as they are.
RAW = ("application/data", "binary")


def declare_stream(connection: Any) -> None:
    """Declare the control plane (``ladder.adoptions`` and its exchange among it) on a channel of its own, if this
    user may: an adopter with its least-privilege row may not, and finds it declared by the operator."""
    declare_control_plane_if_allowed(connection)


def task_due(headers: Any, timezone: Any, name: str = "eta") -> Optional[datetime]:
    """The moment a task message's ``eta`` (or ``expires``) header names, read as the worker reads it;
    None when it is absent or unreadable (Celery then decides, as without the ladder)."""
    value = headers.get(name) if isinstance(headers, dict) else None
    if not value:
        return None
    try:
        return task_eta(value, timezone)
    except (ValueError, TypeError, OverflowError):
        return None


class Mover:
    """Publishes adopted copies and their records on one transactional channel of ``connection``.

    :meth:`stage` adds a copy of a task message (into the ladder, delivered to the
    exchange and routing key it came through) and its record in ``ladder.adoptions``
    to the open transaction; :meth:`commit` makes them durable together, or
    neither if this process dies first. The caller acks each original after the
    commit: one that comes back anyway (the process died in between) is found among
    the records (see :class:`Records`).
    """

    def __init__(self, connection: Any, *, settings: LadderSettings,
                 clock: Optional[Callable[[], float]] = None) -> None:
        declare_stream(connection)
        check_writable(connection, ADOPTED.exchange)  # refused (403) or undeclared (404) before anything moves
        self.channel = connection.channel()
        self.channel.tx_select()
        self.staged = 0
        self._ladder = LadderProducer(self.channel, max_delay=settings.max_delay, queue_type=settings.queue_type,
                                      clock=clock, auto_declare=False)
        self._records = Producer(self.channel, routing_key=STREAM, auto_declare=False)

    def stage(self, message: Any, eta: datetime) -> None:
        """Add the copy of ``message`` (a task message due at ``eta``) and its record to the transaction.

        Raises:
            ValueError, TypeError: the message cannot be copied (its target cannot be delivered
                to, its ETA is beyond ``ladder_max_delay``, its id is not text); nothing was staged.
        """
        headers = dict(message.headers or {})
        headers[ADOPTED_HEADER] = headers["eta"]
        record = encode(str(headers.get("id")), str(headers["eta"]), due=to_millis(eta))
        info = message.delivery_info or {}
        properties = carried(message.properties or {})
        content_type = properties.pop("content_type", None) or RAW[0]
        content_encoding = properties.pop("content_encoding", None) or RAW[1]
        self._ladder.publish(message.body, info.get("routing_key") or "", exchange=info.get("exchange") or "",
                             headers=headers, eta=eta, serializer=None, content_type=content_type,
                             content_encoding=content_encoding, compression=None,
                             delivery_mode=(message.properties or {}).get("delivery_mode"), **properties)
        self._records.publish(record, exchange=ADOPTED.exchange, content_type="application/json",
                              content_encoding="utf-8", delivery_mode=2)
        self.staged += 1

    def commit(self) -> None:
        """Commit the staged copies and records (the broker's ``tx.commit-ok`` is the confirmation)."""
        self.channel.tx_commit()
        self.staged = 0

    def close(self) -> None:
        """Close the channel: what is staged and not committed is dropped by the broker."""
        try:
            self.channel.close()
        except Exception:  # noqa: BLE001 - a dead connection has nothing to close
            logger.debug("closing the adoption channel failed", exc_info=True)


class Records:
    """The adoptions recorded in ``ladder.adoptions``, read on ``connection`` to the stream's end on demand.

    :meth:`catch_up` appends a marker of its own and reads until the marker comes
    back: every record committed before that call is then in :attr:`adopted`.
    Records are untrusted: a bad one is skipped and counted (:attr:`skipped`).
    The first read starts at the stream's first record; a channel opened again
    (after :meth:`close`, or a lost connection) goes on from the last offset read.
    """

    def __init__(self, connection: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.connection = connection
        self.clock = clock
        #: The adopted tasks, by (id, eta).
        self.adopted = Adopted()
        #: The stream's reader: its ``position`` is where a channel opened again goes on from.
        self.reader = StreamReader(STREAM, start="first", clock=clock)
        self._channel: Any = None

    @property
    def skipped(self) -> int:
        """Records skipped because they were not ours."""
        return sum(self.reader.skipped.values())

    def catch_up(self, timeout: float = CATCH_UP_TIMEOUT) -> bool:
        """Read every record committed so far; return whether the stream was read to its end in time."""
        self.reader.timeout = timeout
        if self._channel is None:
            declare_stream(self.connection)
            channel = self.connection.channel()
            self.reader.start(channel, on_record=self._on_record, on_reset=self.adopted.clear)
            self._channel = channel
        else:
            self.reader.mark()
        deadline = time.monotonic() + timeout
        while not self.reader.caught_up and time.monotonic() < deadline:
            self.poll(min(1.0, max(0.0, deadline - time.monotonic())))
        self.adopted.prune(int(self.clock() * 1000))
        return self.reader.caught_up and not self.reader.timed_out

    def poll(self, timeout: float = 0.0) -> None:
        """Read the records that have arrived (waiting up to ``timeout`` seconds for one), and ack them."""
        if self._channel is None:
            return
        try:
            self.connection.drain_events(timeout=timeout)
        except socket.timeout:
            pass
        self.reader.tick()

    def _on_record(self, record: Any, offset: Any) -> None:
        if isinstance(record, Adoption):
            self.adopted.add(record, int(self.clock() * 1000))

    def close(self) -> None:
        """Stop reading (the records read so far, and where reading goes on from, are kept)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            self.reader.forget_channel()
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - a dead connection has nothing to close
                logger.debug("closing the adoption records channel failed", exc_info=True)
