"""The broker closes one of the relay's channels: which publish caused it, and what becomes of the others."""

from __future__ import annotations

import logging
import re
from collections import deque
from typing import Any, Callable, Optional

from ..text import escape, quote
from . import link
from .pending import Publish
from .settle import Settlement, guarded

__all__ = ["ChannelCloses"]

logger = logging.getLogger("kombu_ladder.relay")

W_CLOSED = "the broker closed the relay's %s channel: %s"
E_UNATTRIBUTED = ("cannot tell which publish made the broker close the channel (%s); sending the %d publish(es) "
                  "in flight again one at a time (those the broker had taken are delivered twice)")

#: RabbitMQ's reply to a publish over ``max_message_size`` (the sizes are the body's).
_OVERSIZE = re.compile(r"message size (\d+) is larger than (?:configured )?max size (\d+)")


def _names(text: str, exchange: str) -> bool:
    """Whether a broker's reply text is about ``exchange`` (RabbitMQ names the default one amq.default)."""
    return f"exchange '{exchange or 'amq.default'}' in vhost" in text


def _fails_alike(culprit: Publish, text: str) -> Callable[[Publish], bool]:
    """Which publishes the broker would refuse as it refused ``culprit``: to the same exchange, or as big."""
    size = _OVERSIZE.search(text)
    if size is not None:
        limit = int(size.group(2))
        return lambda publish: len(publish.job.body) > limit
    return lambda publish: publish.exchange == culprit.exchange and _names(text, publish.exchange)


class ChannelCloses(Settlement):
    """The relay's answer to a channel close (a layer of :class:`~kombu_ladder.relay.RelayCore`).

    A publish the broker refuses outright (a missing or internal exchange, no
    write permission, a body over ``max_message_size``) closes the publishing
    channel; the consumed messages are on the other channel and stay the
    relay's. The culprit is parked (a park that is the culprit backs off), the
    publishes the broker took before it count as done, those it dropped after
    it are sent again on a new channel, except those it would refuse alike,
    which are parked with the same reason. A close on the consuming channel
    gives every message held back to the broker: the relay forgets them and
    consumes again.
    """

    # -- the broker closes a channel ----------------------------------------------------

    @guarded("the broker closing the publishing channel")
    def _publisher_closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        careful = self._careful is not None
        link.discard(self._publisher)
        self._publisher = None
        lost, held = self.pending.lose_channel()
        culprit = self._culprit(lost, text, (class_id, method_id), careful=careful)
        logger.warning(W_CLOSED, "publishing", quote(text))
        self._open_publisher()
        if culprit is None:
            logger.error(E_UNATTRIBUTED, quote(text), len(lost))
            self._careful = deque([*lost, *held, *(self._careful or ())])
            self._suspects = len(lost) + len(held)
            self._next_careful()
            return
        index = lost.index(culprit)
        for publish in lost[:index]:  # the broker took these before it closed the channel
            self._succeeded(publish)
        reason = f"unroutable: {escape(text)}"
        self._learn(culprit.exchange, text)
        doomed = _fails_alike(culprit, text)
        for publish in [culprit, *lost[index + 1:], *held]:  # the rest was dropped by the broker
            if publish is not culprit and not doomed(publish):
                self._send(publish)
            elif publish.kind == "park":
                self._back_off(publish, escape(text))
            else:
                self._park(publish.job, reason)

    def _culprit(self, lost: list[Publish], text: str, method: tuple[int, int], *,
                 careful: bool) -> Optional[Publish]:
        """The publish that made the broker close the channel.

        RabbitMQ handles a channel's publishes in order and drops all after the
        one it refuses, whose exchange (or, over ``max_message_size``, whose
        body size) its reply text names: the first unconfirmed publish that fits
        is the culprit. When sending one at a time, the one in flight is.
        """
        if careful and len(lost) == 1:
            return lost[0]
        if method != (60, 40):  # basic.publish
            return None
        size = _OVERSIZE.search(text)
        for publish in lost:
            if size is not None:
                if len(publish.job.body) == int(size.group(1)):
                    return publish
            elif _names(text, publish.exchange):
                return publish
        return None

    def _learn(self, exchange: str, text: str) -> None:
        learn = getattr(self.exchange_check, "learn", None)
        if learn is not None and exchange:
            internal = "internal exchange" in text
            learn(exchange, quote(text), ttl=getattr(self.exchange_check, "ttl", None) if internal else None)

    @guarded("the broker closing the consuming channel")
    def _consume_closed(self, code: int, text: str, class_id: int, method_id: int) -> None:
        """The broker took back every message the relay held: forget them and consume again."""
        logger.warning(W_CLOSED, "consuming", quote(text))
        link.discard(self._consume)
        self._consume = None
        self.pending.forget_jobs()
        self._waiting.clear()
        self._open_consumer(link.sibling(self._publisher))

    def _open_publisher(self) -> None:
        raise NotImplementedError

    def _open_consumer(self, channel: Any) -> None:
        raise NotImplementedError
