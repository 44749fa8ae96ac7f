"""IndexWriter: producers' entries appended to ``ladder.index`` in batches, never holding up a publish."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional, Sequence

from ..controlplane import ENTRY, declare_control_plane
from ..controlplane.codec import Entries
from ..controlplane.writer import write_records
from ..link import close_quietly
from ..topology import check_writable, declare_control_plane_if_allowed
from .records import STREAM, Entry, encode_batch

__all__ = ["IndexWriter", "IndexRefused", "Send", "BATCH", "declare_index", "open_index", "append"]

logger = logging.getLogger("kombu_ladder.index")

W_UNDECLARED = "could not declare the stream %s (%s); index entries are sent to it anyway"
W_NOT_APPENDED = "could not append %d index entr(y/ies) to %s (%s); %s"
I_NO_STREAM = "%s does not exist (the index is not in use here): %d entr(y/ies) not written"
W_REFUSED = ("unindexed: %s. The messages this producer schedules are delivered as always, but none is indexed "
             "until it is restarted with the rights of kombu_ladder.permissions.indexer()")


#: Entries :func:`append` sends in one record, at most.
BATCH = 200

#: Seconds a record waits, at most, for the first record's check (on another thread) before it is counted lost.
OPEN_WAIT = 10.0

#: Publishes one record's bytes to ``ladder.index`` (on the calling producer's channel).
Send = Callable[[bytes], Any]


def declare_index(channel: Any) -> None:
    """Declare the control plane, ``ladder.index`` and its exchange among it, on ``channel`` (the operator's rights)."""
    declare_control_plane(channel)


class IndexRefused(Exception):
    """This user cannot append to ``ladder.index`` (the message says why); its producer schedules unindexed."""


def open_index(connection: Any, *, at: int = 0) -> None:
    """Check, on a channel of its own, that this user can append to ``ladder.index`` through its exchange.

    The control plane is declared first where this user may (full rights); a least-privilege
    indexer may not, and finds it declared by the operator. A publish the broker refuses
    closes the channel it was sent on, later and without an answer: sent on a producer's
    own channel, it would fail that producer's next publish. So one write is tried on a
    channel of its own: a probe to the entry exchange with a routing key bound to nothing
    (checked as a record is, stored nowhere), followed by a round trip that receives the refusal.

    Arguments:
        connection: a :class:`kombu.Connection`.
        at: unused (kept for callers).

    Raises:
        IndexRefused: the exchange does not exist, or the user may not write it.
    """
    declare_control_plane_if_allowed(connection)
    errors = connection.channel_errors
    try:
        check_writable(connection, ENTRY.exchange)
    except errors as exc:
        code = getattr(exc, "reply_code", None)
        if code not in (403, 404):
            raise
        problem = "does not exist (the operator's 'kombu-ladder declare' declares it)" if code == 404 \
            else "may not be written by this user"
        raise IndexRefused(f"the exchange {ENTRY.exchange}, the only way into {STREAM}, {problem} "
                           f"({getattr(exc, 'reply_text', None) or exc})") from None


class IndexWriter:
    """Sends each entry to ``ladder.index`` in a record of its own, confirmed before its message is published.

    :meth:`write` is called before each publish into a rung, with the publishing
    producer's ``send``, which waits for the broker's confirm (a writer may be shared
    by the producers of a pool, as Celery's are: each call sends on the caller's
    channel, in the caller's thread).

    ``declare`` (given to :meth:`write`) is called once,
    before the first record: a producer's declares the stream and checks that it may
    write it (:func:`open_index`). Where it raises :class:`IndexRefused` the writer logs
    that once and sends nothing more: every later entry is counted in :attr:`lost`,
    silently, and no record is ever sent on a producer's channel, which a refused
    publish would close.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Whether the stream was declared (or that was tried).
        self.declared = False
        #: Entries sent, and entries lost (a record that could not be sent).
        self.sent = 0
        self.lost = 0
        #: Set once the first record's ``declare`` has answered: no other record is sent before.
        self._opened = threading.Event()
        #: Why this writer sends nothing (the user may not write the stream); None: it sends.
        self.refused: Optional[str] = None

    def write(self, entry: Entry, send: Send, declare: Optional[Callable[[], Any]] = None) -> bool:
        """Send ``entry`` now, in a record of its own, with ``send`` (which waits for the broker's confirm):
        the producer's path, before the message it indexes is published.

        The first call runs ``declare`` (the check that this user may write the index): where it raises
        :class:`IndexRefused` the writer logs that once and indexes nothing more (the message is still
        published, unindexed, as without the indexer's row). Any other failure is raised: the caller then
        does not publish the message, so no message waits without its entry.

        Returns:
            Whether the entry was written (False: this writer was refused).
        """
        with self._lock:
            if self.refused is not None:
                self.lost += 1
                return False
            first, self.declared = not self.declared, True
        if first:
            try:
                if declare is not None:
                    declare()
            except IndexRefused as exc:
                self._refuse(str(exc), 1)
                return False
            finally:
                self._opened.set()
        elif not self._opened.wait(OPEN_WAIT) or self.refused is not None:  # another thread is checking
            with self._lock:
                self.lost += 1
            return False
        send(encode_batch([entry]))
        with self._lock:
            self.sent += 1
        return True

    def _refuse(self, reason: str, lost: int) -> None:
        with self._lock:
            self.refused = reason
            self.lost += lost
        logger.warning(W_REFUSED, reason)


def append(connection: Any, entries: Sequence[Entry], *, declare: bool = False, what: str = "") -> bool:
    """Append ``entries`` to ``ladder.index`` on a channel of its own, in records of :data:`BATCH`, confirms
    pipelined (:func:`~kombu_ladder.controlplane.writer.write_records`): for an operator's command (a
    reschedule, a move), not a producer's publish path.

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
    channel: Any = None
    try:
        if declare:
            if not declare_control_plane_if_allowed(connection):
                logger.warning(W_UNDECLARED, STREAM, "this user may not declare the control plane")
        channel = connection.channel()
        try:
            channel.queue_declare(queue=STREAM, passive=True)
        except connection.channel_errors:
            logger.info(I_NO_STREAM, STREAM, len(entries))
            return False
        write_records(connection, [Entries(tuple(entries[start:start + BATCH]))
                                   for start in range(0, len(entries), BATCH)], STREAM)
    except Exception as exc:  # noqa: BLE001 - the index never fails the command it indexes
        logger.warning(W_NOT_APPENDED, len(entries), STREAM, getattr(exc, "reply_text", None) or exc,
                       what or "those messages are waiting but unindexed")
        return False
    finally:
        close_quietly(channel)
    return True
