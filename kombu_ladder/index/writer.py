"""IndexWriter: producers' entries appended to ``ladder.index`` in batches, never holding up a publish."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

from kombu import Producer

from ..carry import waiting_for_confirms
from .records import MAX_ENTRIES, STREAM, STREAM_ARGUMENTS, Entry, encode_batch

__all__ = ["IndexWriter", "Send", "BATCH", "LINGER", "declare_index", "append"]

logger = logging.getLogger("kombu_ladder.index")

W_LOST = "could not append %d index entr(y/ies) to %s (%s); those messages are waiting but unindexed"
W_UNDECLARED = "could not declare the stream %s (%s); index entries are sent to it anyway"
W_NOT_APPENDED = "could not append %d index entr(y/ies) to %s (%s); %s"
I_NO_STREAM = "%s does not exist (the index is not in use here): %d entr(y/ies) not written"

#: Entries a writer sends in one record, at most.
BATCH = 200
#: Seconds after the last record was sent within which a new entry waits for others (at most this long, and
#: only while more publishes come): a producer publishing less often than this sends each entry at once.
LINGER = 0.25

#: Publishes one record's bytes to ``ladder.index`` (on the calling producer's channel).
Send = Callable[[bytes], Any]


def declare_index(channel: Any) -> None:
    """Declare the ``ladder.index`` stream on ``channel``."""
    channel.queue_declare(queue=STREAM, durable=True, auto_delete=False, arguments=dict(STREAM_ARGUMENTS))


class IndexWriter:
    """Collects entries and sends them to ``ladder.index`` in batches.

    :meth:`add` is called after each publish into a rung, with the publishing
    producer's ``send`` (a writer may be shared by the producers of a pool, as
    Celery's are: each call sends on the caller's channel, in the caller's
    thread). The batch is sent when it holds ``batch`` entries, or when the last
    record was sent over ``linger`` seconds ago: a producer that publishes now
    and then sends each entry at once, a busy one one record per ``batch``
    publishes. The entries of a burst's last ``linger`` go with the next publish
    of any message (:meth:`tick`), or at :meth:`flush`. A failure to send is
    logged and counted in :attr:`lost`, never raised: the message itself is
    waiting, only unindexed.

    Arguments:
        declare: declares the stream, called once (with the first record's sender's ``declare``).
    """

    def __init__(self, *, batch: int = BATCH, linger: float = LINGER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < batch <= MAX_ENTRIES:
            raise ValueError(f"batch must be 1 to {MAX_ENTRIES}, not {batch!r}")
        self.batch = batch
        self.linger = linger
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: list[Entry] = []
        self._sent_at = float("-inf")
        #: Whether the stream was declared (or that was tried).
        self.declared = False
        #: Entries sent, and entries lost (a record that could not be sent).
        self.sent = 0
        self.lost = 0

    def add(self, entry: Entry, send: Send, declare: Optional[Callable[[], Any]] = None) -> None:
        """Keep ``entry``; send the batch (with ``send``) if it is full or the last was sent over ``linger`` ago."""
        with self._lock:
            self._pending.append(entry)
            due = len(self._pending) >= self.batch or self._clock() - self._sent_at >= self.linger
        if due:
            self.flush(send, declare)

    def tick(self, send: Send, declare: Optional[Callable[[], Any]] = None) -> None:
        """Send the entries kept if the last record was sent over ``linger`` ago (a cheap check, per publish)."""
        if self._pending and self._clock() - self._sent_at >= self.linger:
            self.flush(send, declare)

    def flush(self, send: Send, declare: Optional[Callable[[], Any]] = None) -> None:
        """Send the entries kept (one record) with ``send``; a failure is logged, never raised."""
        with self._lock:
            pending, self._pending = self._pending, []
            if not pending:
                return
            self._sent_at = self._clock()
            first, self.declared = not self.declared, True
        try:
            if first and declare is not None:
                try:
                    declare()
                except Exception as exc:  # noqa: BLE001 - declared by the operator, perhaps
                    logger.warning(W_UNDECLARED, STREAM, exc)
            send(encode_batch(pending))
        except Exception as exc:  # noqa: BLE001 - the index never fails a publish
            self.lost += len(pending)
            logger.warning(W_LOST, len(pending), STREAM, exc)
            return
        self.sent += len(pending)

    @property
    def pending(self) -> int:
        """Entries kept, not sent yet."""
        return len(self._pending)


def _close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - a dead connection (or a closed channel) has nothing to close
        logger.debug("closing the index channel failed", exc_info=True)


def append(connection: Any, entries: Sequence[Entry], *, declare: bool = False, what: str = "") -> bool:
    """Append ``entries`` to ``ladder.index`` on a channel of its own, in records of :data:`BATCH`, each one
    confirmed: for an operator's command (a reschedule, a move), not a producer's publish path.

    Only where the stream exists: an index nobody uses is not started by a command. With ``declare`` the
    stream is declared first (a refusal is logged, and the stream may exist all the same). Nothing is
    raised: the command the entries belong to has done its work already; a refusal is logged on the
    ``kombu_ladder.index`` logger (as a warning; ``what`` says what is left unindexed).

    Returns:
        Whether every entry was appended (False: no stream, or the broker refused them).
    """
    entries = list(entries)
    if not entries:
        return True
    channel = None
    try:
        if declare:
            channel = connection.channel()
            try:
                declare_index(channel)
            except connection.channel_errors as exc:
                logger.warning(W_UNDECLARED, STREAM, getattr(exc, "reply_text", None) or exc)
                _close_quietly(channel)
                channel = None
        if channel is None:
            channel = connection.channel()
        try:
            channel.queue_declare(queue=STREAM, passive=True)
        except connection.channel_errors:
            logger.info(I_NO_STREAM, STREAM, len(entries))
            return False
        channel = waiting_for_confirms(channel)
        producer = Producer(channel, auto_declare=False)
        for start in range(0, len(entries), BATCH):
            producer.publish(encode_batch(entries[start:start + BATCH]), exchange="", routing_key=STREAM,
                             content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                             mandatory=True, retry=False)
    except Exception as exc:  # noqa: BLE001 - the index never fails the command it indexes
        logger.warning(W_NOT_APPENDED, len(entries), STREAM, getattr(exc, "reply_text", None) or exc,
                       what or "those messages are waiting but unindexed")
        return False
    finally:
        if channel is not None:
            _close_quietly(channel)
    return True
