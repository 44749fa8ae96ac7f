"""IndexWriter: producers' entries appended to ``ladder.index`` in batches, never holding up a publish."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

from kombu import Producer

from ..carry import waiting_for_confirms
from ..link import close_quietly
from .records import MAX_ENTRIES, STREAM, STREAM_ARGUMENTS, Entry, encode_batch, encode_marker

__all__ = ["IndexWriter", "IndexRefused", "Send", "BATCH", "LINGER", "declare_index", "open_index", "append"]

logger = logging.getLogger("kombu_ladder.index")

W_LOST = "could not append %d index entr(y/ies) to %s (%s); those messages are waiting but unindexed"
W_UNDECLARED = "could not declare the stream %s (%s); index entries are sent to it anyway"
W_NOT_APPENDED = "could not append %d index entr(y/ies) to %s (%s); %s"
I_NO_STREAM = "%s does not exist (the index is not in use here): %d entr(y/ies) not written"
W_REFUSED = ("unindexed: %s. The messages this producer schedules are delivered as always, but none is indexed "
             "until it is restarted with the rights of kombu_ladder.permissions.indexer()")
I_FOUND = "may not declare the stream %s (%s), which exists: index entries are sent to it"


#: Entries a writer sends in one record, at most.
BATCH = 200
#: Seconds after the last record was sent within which a new entry waits for others (at most this long, and
#: only while more publishes come): a producer publishing less often than this sends each entry at once.
LINGER = 0.25

#: Seconds a record waits, at most, for the first record's check (on another thread) before it is counted lost.
OPEN_WAIT = 10.0

#: Publishes one record's bytes to ``ladder.index`` (on the calling producer's channel).
Send = Callable[[bytes], Any]


def declare_index(channel: Any) -> None:
    """Declare the ``ladder.index`` stream on ``channel``."""
    channel.queue_declare(queue=STREAM, durable=True, auto_delete=False, arguments=dict(STREAM_ARGUMENTS))


class IndexRefused(Exception):
    """This user cannot append to ``ladder.index`` (the message says why); its producer schedules unindexed."""


def open_index(connection: Any, *, at: int = 0) -> None:
    """Check, on a channel of its own, that this user can append to ``ladder.index``, declaring it first.

    A publish the broker refuses closes the channel it was sent on, later and without an
    answer: sent on a producer's own channel, it would fail that producer's next publish.
    So the declare and one write (a reader's marker, which readers skip) are tried on a
    channel of their own, the write followed by a round trip that receives the refusal.
    A refused declare is no refusal when the stream exists (an operator declared it).

    Arguments:
        connection: a :class:`kombu.Connection`.
        at: the marker's time (epoch ms).

    Raises:
        IndexRefused: the user may not write the stream, or it does not exist and the user may not declare it.
    """
    errors = connection.channel_errors
    channel = connection.channel()
    try:
        try:
            declare_index(channel)
        except errors as exc:
            code = getattr(exc, "reply_code", None)
            if code not in (403, 404):  # 404: the stream exists, its node not serving it yet (after a restart)
                raise
            close_quietly(channel)
            channel = connection.channel()
            if code == 403:
                try:
                    channel.queue_declare(queue=STREAM, passive=True)
                except errors as missing:
                    # 403: this user may not check (from RabbitMQ 4.2.6 a passive declare needs a permission on
                    # the queue); the marker's append below tells whether it may write the stream.
                    if getattr(missing, "reply_code", None) not in (403, 404):
                        raise
                    if getattr(missing, "reply_code", None) == 404 and not _starting(missing):
                        raise IndexRefused(f"the stream {STREAM} does not exist and this user may not declare it "
                                           f"({getattr(exc, 'reply_text', None) or exc})") from None
                    close_quietly(channel)
                    channel = connection.channel()
                logger.info(I_FOUND, STREAM, getattr(exc, "reply_text", None) or exc)
        try:
            Producer(channel, auto_declare=False).publish(
                encode_marker(uuid.uuid4().hex, at=at), exchange="", routing_key=STREAM,
                content_type="application/json", content_encoding="utf-8", delivery_mode=2, retry=False)
            channel.basic_qos(0, 0, False)  # a round trip: a refused publish is answered before it
        except errors as exc:
            if getattr(exc, "reply_code", None) != 403:
                raise
            raise IndexRefused(f"this user may not append to the stream {STREAM} through the default exchange "
                               f"({getattr(exc, 'reply_text', None) or exc})") from None
    finally:
        close_quietly(channel)


def _starting(exc: Exception) -> bool:
    """Whether a 404 says the stream exists but its node is not serving it yet (just after a broker restart)."""
    return "home node" in str(getattr(exc, "reply_text", None) or exc)


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

    ``declare`` (given to :meth:`add`, :meth:`tick` and :meth:`flush`) is called once,
    before the first record: a producer's declares the stream and checks that it may
    write it (:func:`open_index`). Where it raises :class:`IndexRefused` the writer logs
    that once and sends nothing more: every later entry is counted in :attr:`lost`,
    silently, and no record is ever sent on a producer's channel, which a refused
    publish would close.
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
        #: Set once the first record's ``declare`` has answered: no other record is sent before.
        self._opened = threading.Event()
        #: Why this writer sends nothing (the user may not write the stream); None: it sends.
        self.refused: Optional[str] = None

    def add(self, entry: Entry, send: Send, declare: Optional[Callable[[], Any]] = None) -> None:
        """Keep ``entry``; send the batch (with ``send``) if it is full or the last was sent over ``linger`` ago."""
        with self._lock:
            if self.refused is not None:
                self.lost += 1
                return
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
            if self.refused is not None:
                self.lost += len(pending)
                return
            self._sent_at = self._clock()
            first, self.declared = not self.declared, True
        if first:
            try:
                if declare is not None:
                    declare()
            except IndexRefused as exc:
                self._refuse(str(exc), len(pending))
                return
            except Exception as exc:  # noqa: BLE001 - declared by the operator, perhaps
                logger.warning(W_UNDECLARED, STREAM, exc)
            finally:
                self._opened.set()
        elif not self._opened.wait(OPEN_WAIT) or self.refused is not None:  # another thread is checking
            with self._lock:
                self.lost += len(pending)
            return
        try:
            send(encode_batch(pending))
        except Exception as exc:  # noqa: BLE001 - the index never fails a publish
            self.lost += len(pending)
            logger.warning(W_LOST, len(pending), STREAM, exc)
            return
        self.sent += len(pending)

    def _refuse(self, reason: str, pending: int) -> None:
        with self._lock:
            self.refused = reason
            self.lost += pending + len(self._pending)
            self._pending = []
        logger.warning(W_REFUSED, reason)

    @property
    def pending(self) -> int:
        """Entries kept, not sent yet."""
        return len(self._pending)


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
                close_quietly(channel)
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
        close_quietly(channel)
    return True
