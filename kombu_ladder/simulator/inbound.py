"""What the broker sends a simulated channel (deliveries, confirms, returns, closes), as py-amqp hands it over."""

from __future__ import annotations

import logging
from typing import Any, Callable

from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.exceptions import ChannelError, error_for_code

from .client_codec import client_body, copy_decoded
from .frames import Close, Confirm, Delivery, Return

__all__ = ["Inbound"]

logger = logging.getLogger("kombu_ladder.simulator.channel")

W_NO_CALLBACK = "rejecting delivery %s for consumer %s: it has no callback (cancelled?)"


class Inbound:
    """The half of the simulator's :class:`~.channel.Channel` that the broker drives.

    The broker calls the hooks with its lock held; they post frames to the
    connection. ``drain_events`` fires the frames in the consuming thread,
    where they reach the consumer's callback or the ``events`` handlers as
    py-amqp would hand them over. On a channel the connection's guard watches
    (see :class:`kombu_ladder.link.Guard`), a message arrives with its
    properties as bytes, and a close goes to the guard instead of raising.
    """

    broker: Any
    connection: Any
    channel_id: int
    closed: bool
    closing: Any
    deferred: list[tuple[int, bool]]
    generation: int
    confirmed: int
    nacked: set[int]
    events: Any
    callbacks: dict[str, Callable[[Any], Any]]
    unacked: Any
    _publish_seq: int
    _delivery_tag: int
    _reset: Callable[[], None]
    basic_reject: Callable[..., None]

    # -- hooks the broker calls (with its lock held) ----------------------------

    def next_publish_seq(self) -> int:
        """Return the confirm sequence number of the next publish (1 after confirm_select)."""
        self._publish_seq += 1
        return self._publish_seq

    def next_delivery_tag(self) -> int:
        """Return the next delivery tag on this channel (from 1)."""
        self._delivery_tag += 1
        return self._delivery_tag

    def post_delivery(self, consumer_tag: str, delivery_tag: int, message: Any) -> None:
        """Send basic.deliver to this channel's connection."""
        self.connection.post(Delivery(self, consumer_tag, delivery_tag, message))

    def post_confirm(self, seq: int, ack: bool) -> None:
        """Send basic.ack (or basic.nack) of publish ``seq``."""
        self.connection.post(Confirm(self, seq, ack))

    def post_return(self, code: int, text: str, exchange: str, routing_key: str, body: bytes,
                    properties: dict[str, Any], raw: bytes) -> None:
        """Send basic.return of an unroutable mandatory publish."""
        self.connection.post(Return(self, code, text, exchange, routing_key, body, properties, raw))

    def broker_closed(self, error: BaseException) -> None:
        """The broker closes this channel because of ``error``: it requeues what the channel held
        unacked, forgets the confirms it had not sent, and sends channel.close."""
        self.broker.close_channel(self)
        self.closing = error
        self.deferred = []
        self.connection.post(Close(self, error))

    # -- events, run by drain_events in the consuming thread ------------------------

    def _raw(self, body: bytes, properties: dict[str, Any]) -> AmqpMessage:
        properties = copy_decoded(properties)
        return AmqpMessage(client_body(body, properties), channel=self, **properties)

    def _guarded(self, raw: bytes) -> bool:
        """Hand the encoded properties to the connection's guard, if it guards this channel (see
        :class:`kombu_ladder.link.Guard`, which a relay's py-amqp connection runs on its frames)."""
        guard = self.connection.guard
        if not guard.watches(self.channel_id):
            return False
        guard.header(self.channel_id, self.broker.profile.outgoing(raw))
        return True

    def _content(self, stored: Any) -> AmqpMessage:
        if self._guarded(stored.raw):
            return AmqpMessage(stored.body, channel=self)  # py-amqp is shown no properties
        if stored.undecodable is not None:
            raise stored.undecodable  # what py-amqp's frame reader raises on these properties
        return self._raw(stored.body, stored.properties)

    def _on_delivery(self, event: Delivery) -> None:
        if self.closed or event.generation != self.generation:
            return  # the channel was closed or reset since: the message went back to its queue
        stored = event.message
        raw = self._content(stored)
        raw.delivery_info = {
            "consumer_tag": event.consumer_tag, "delivery_tag": event.delivery_tag,
            "redelivered": event.redelivered, "exchange": stored.exchange, "routing_key": stored.routing_key,
        }
        callback = self.callbacks.get(event.consumer_tag)
        if callback is None:
            logger.warning(W_NO_CALLBACK, event.delivery_tag, event.consumer_tag)
            if event.delivery_tag in self.unacked:
                self.basic_reject(event.delivery_tag, requeue=True)
            return
        callback(raw)

    def _on_confirm(self, event: Confirm) -> None:
        if event.generation != self.generation:
            return
        if not event.ack:
            self.nacked.add(event.seq)
        self.confirmed = max(self.confirmed, event.seq)
        for handler in list(self.events["basic_ack" if event.ack else "basic_nack"]):
            handler(event.seq, event.multiple)

    def _on_return(self, event: Return) -> None:
        if event.generation != self.generation:
            return
        code, text, exchange, routing_key, body, properties, raw = event.args
        exc = error_for_code(code, text, spec.Basic.Return, ChannelError)
        guarded = self._guarded(raw)
        handlers = self.events.get("basic_return")
        if not handlers:
            raise exc
        for handler in list(handlers):
            handler(exc, exchange, routing_key,
                    AmqpMessage(body, channel=self) if guarded else self._raw(body, properties))

    def _on_close(self, event: Close) -> None:
        if event.generation != self.generation or self.closing is None:
            return  # the client met the error on a synchronous call already
        error = event.error
        if self.connection.guard.closed(self.channel_id, error.reply_code, error.reply_text, *error.method_sig):
            return
        self._reset()  # py-amqp answers close-ok, reopens the channel and raises the error
        raise error

    def discard(self) -> None:
        """Let go of a channel the broker closed (the relay's answer to channel.close)."""
        self.closing = None
        self.closed = True
        self.generation += 1
        if self in self.connection.channels:
            self.connection.channels.remove(self)
