"""The simulator's channel: py-amqp's methods, signatures and events, backed by a SimulatedBroker."""

from __future__ import annotations

import struct
from collections import OrderedDict, defaultdict
from typing import Any, Callable, Optional, Protocol

import amqp
from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.exceptions import (
    AMQPNotImplementedError,
    ChannelError,
    FrameError,
    MessageNacked,
    PreconditionFailed,
    RecoverableConnectionError,
)
from amqp.protocol import queue_declare_ok_t
from kombu.transport import pyamqp, virtual
from kombu.transport.base import to_rabbitmq_queue_arguments

from .client_codec import body_bytes
from .declarations import token
from .inbound import Inbound

__all__ = ["Channel", "Connection"]


class Connection(Protocol):
    """What a channel uses of its connection (the simulator's transport, which imports this module)."""

    broker: Any
    client: Any
    frame_max: int

    def claim(self) -> None: ...

    def process_until(self, done: Callable[[], bool]) -> int: ...

    def close_channel(self, channel: Any) -> None: ...


def _channel_op(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a channel method; a channel error resets the channel as RabbitMQ and py-amqp do.

    A synchronous method called after the broker closed the channel (its
    ``channel.close`` not read yet) raises that error, as py-amqp does when
    the close arrives instead of the reply it waits for.
    """
    def wrapper(self: "Channel", *args: Any, **kwargs: Any) -> Any:
        if self.closing is not None:
            error = self.closing
            self._reset()
            raise error
        if self.closed:
            raise RecoverableConnectionError("connection already closed")
        try:
            return method(self, *args, **kwargs)
        except ChannelError:
            self._reset()
            raise
        except amqp.exceptions.IrrecoverableConnectionError:
            self.connection.client.release()
            raise
    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def _no_reply_op(method: Callable[..., Any]) -> Callable[..., Any]:
    """A method py-amqp sends without waiting for a reply: on a channel the broker is closing, it is dropped."""
    op = _channel_op(method)

    def wrapper(self: "Channel", *args: Any, **kwargs: Any) -> Any:
        if self.closing is not None:
            return None
        return op(self, *args, **kwargs)
    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


class Channel(Inbound, virtual.Channel):
    """A channel with py-amqp's methods, signatures and event handlers (``events``).

    The AMQP methods behave as py-amqp's against RabbitMQ 3.10; see the
    broker for the rules. A channel error closes the channel on the broker
    (consumers cancelled, unacked messages requeued) and, as py-amqp does,
    reopens it, so the same object stays usable.
    """

    Message = pyamqp.Message  # type: ignore[assignment]

    #: ``basic_publish`` writes a message's properties with ``_serialize_properties``, as py-amqp does,
    #: so a publisher may hand it encoded properties (:class:`kombu_ladder.link.RawMessage`).
    sends_encoded_properties = True

    def __init__(self, connection: Connection, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.broker = connection.broker
        #: py-amqp's event handlers: ``basic_ack``, ``basic_nack``, ``basic_return``.
        self.events: defaultdict[str, set[Callable[..., Any]]] = defaultdict(set)
        self.no_ack_consumers: set[str] = set()  # type: ignore[assignment]
        self.callbacks: dict[str, Callable[[Any], Any]] = {}
        self.consumers: dict[str, Any] = {}
        self.unacked: "OrderedDict[int, Any]" = OrderedDict()
        self.generation = 0
        self._open()

    def _open(self) -> None:
        self.prefetch = 0
        self.global_prefetch = 0
        self.confirm = False
        self.confirmed = 0
        self.nacked: set[int] = set()
        self._publish_seq = 0
        self._delivery_tag = 0
        self.closed = False
        #: The error the broker closed this channel with, until the client reads the close.
        self.closing: Optional[BaseException] = None
        #: Confirms of routed publishes, sent once their queues have taken them (see flush_confirms).
        self.deferred: list[tuple[int, bool]] = []
        #: Publishes and acks held until ``tx.commit`` once the channel is transactional (None: it is not).
        self.transaction: Optional[list[Callable[[], Any]]] = None

    def _reset(self) -> None:
        """What a channel error does: the broker closes the channel, py-amqp reopens it."""
        self.broker.close_channel(self)
        self.callbacks.clear()
        self.no_ack_consumers.clear()
        self.generation += 1
        self._open()

    # -- AMQP methods ---------------------------------------------------------------

    @_channel_op
    def exchange_declare(self, exchange: str = "", type: str = "direct", passive: bool = False,
                         durable: bool = False, auto_delete: bool = True, nowait: bool = False,
                         arguments: Optional[dict[str, Any]] = None, internal: bool = False, **_: Any) -> None:
        self.broker.exchange_declare(self, exchange, type, durable=durable, auto_delete=auto_delete,
                                     internal=internal, arguments=arguments, passive=passive)

    @_channel_op
    def exchange_delete(self, exchange: str = "", if_unused: bool = False, nowait: bool = False) -> None:
        self.broker.exchange_delete(exchange, if_unused=if_unused)

    @_channel_op
    def exchange_bind(self, destination: str, source: str = "", routing_key: str = "", nowait: bool = False,
                      arguments: Optional[dict[str, Any]] = None) -> None:
        self.broker.bind(source, destination, routing_key, arguments, to_exchange=True)

    @_channel_op
    def exchange_unbind(self, destination: str, source: str = "", routing_key: str = "", nowait: bool = False,
                        arguments: Optional[dict[str, Any]] = None) -> None:
        self.broker.bind(source, destination, routing_key, arguments, to_exchange=True, unbind=True)

    @_channel_op
    def queue_declare(self, queue: str = "", passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = True, nowait: bool = False,
                      arguments: Optional[dict[str, Any]] = None, **_: Any) -> Any:
        return queue_declare_ok_t(*self.broker.queue_declare(
            self, queue, passive=passive, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
            arguments=arguments))

    @_channel_op
    def queue_bind(self, queue: str, exchange: str = "", routing_key: str = "", nowait: bool = False,
                   arguments: Optional[dict[str, Any]] = None, **_: Any) -> None:
        self.broker.bind(exchange, queue, routing_key, arguments)

    @_channel_op
    def queue_unbind(self, queue: str, exchange: str, routing_key: str = "", nowait: bool = False,
                     arguments: Optional[dict[str, Any]] = None, **_: Any) -> None:
        self.broker.bind(exchange, queue, routing_key, arguments, unbind=True)

    @_channel_op
    def queue_purge(self, queue: str = "", nowait: bool = False, **_: Any) -> int:
        return self.broker.queue_purge(queue)

    @_channel_op
    def queue_delete(self, queue: str = "", if_unused: bool = False, if_empty: bool = False,
                     nowait: bool = False, **_: Any) -> int:
        return self.broker.queue_delete(queue, if_unused=if_unused, if_empty=if_empty)

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def prepare_message(self, body: Any, priority: Optional[int] = None, content_type: Optional[str] = None,
                        content_encoding: Optional[str] = None, headers: Optional[dict[str, Any]] = None,
                        properties: Optional[dict[str, Any]] = None) -> AmqpMessage:
        return AmqpMessage(body, priority=priority, content_type=content_type,
                           content_encoding=content_encoding, application_headers=headers,
                           **(properties or {}))

    def message_to_python(self, raw_message: Any) -> Any:
        return self.Message(raw_message, channel=self)

    def _basic_publish(self, msg: Any, exchange: str = "", routing_key: str = "", mandatory: bool = False,
                       immediate: bool = False, **_: Any) -> None:
        if self.closing is not None:
            return  # sent, and dropped by the broker: it is closing this channel
        if self.closed:
            raise RecoverableConnectionError("connection already closed")
        if immediate:
            raise AMQPNotImplementedError("NOT_IMPLEMENTED - immediate=true", spec.Basic.Publish, reply_code=540)
        exchange, routing_key = exchange or "", routing_key or ""
        for name in (exchange, routing_key):  # py-amqp packs them as short strings
            struct.pack("B", len(name.encode("utf-8", "surrogatepass")))
        body = body_bytes(msg.body, msg.properties)  # a str body sets content_encoding, as py-amqp does
        raw = msg._serialize_properties()
        if len(raw) + 20 > self.connection.frame_max:  # one frame: RabbitMQ closes the connection
            self.connection.client.release()
            raise FrameError(f"FRAME_ERROR - content header of {len(raw) + 20} bytes over frame_max "
                             f"{self.connection.frame_max}", spec.Basic.Publish, reply_code=501)
        self._transacted(self.broker.publish, self, body, raw, exchange, routing_key, mandatory=mandatory)

    basic_publish = _basic_publish  # type: ignore[assignment]

    def _transacted(self, operation: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Do ``operation`` now, or at ``tx.commit`` on a transactional channel (a close drops it)."""
        if self.transaction is None:
            operation(*args, **kwargs)
        else:
            self.transaction.append(lambda: operation(*args, **kwargs))

    @_channel_op
    def tx_select(self) -> None:
        """Make the channel transactional, as RabbitMQ does (refused on a channel in confirm mode)."""
        if self.confirm:
            raise PreconditionFailed("PRECONDITION_FAILED - cannot switch from confirm to tx mode",
                                     spec.Tx.Select, reply_code=406)
        if self.transaction is None:
            self.transaction = []

    @_channel_op
    def tx_commit(self) -> None:
        """Apply the publishes and acks held since the last commit, in order."""
        if self.transaction is None:
            raise PreconditionFailed("PRECONDITION_FAILED - channel is not transactional", spec.Tx.Commit,
                                     reply_code=406)
        held, self.transaction = self.transaction, []
        with self.broker.lock:  # all at once: nothing sees half a transaction
            for operation in held:
                operation()

    @_channel_op
    def tx_rollback(self) -> None:
        """Drop the publishes and acks held since the last commit."""
        if self.transaction is None:
            raise PreconditionFailed("PRECONDITION_FAILED - channel is not transactional", spec.Tx.Rollback,
                                     reply_code=406)
        self.transaction = []

    def basic_publish_confirm(self, *args: Any, **kwargs: Any) -> None:
        """Publish and wait for the broker's confirm, as py-amqp's does; a nack raises MessageNacked."""
        kwargs.pop("confirm_timeout", None)
        if not self.confirm:
            self.confirm_select()
        self._basic_publish(*args, **kwargs)
        seq = self._publish_seq
        self.connection.process_until(lambda: self.confirmed >= seq or self.closed)
        if self.closing is not None:  # the broker closed the channel instead of confirming: py-amqp raises why
            error = self.closing
            self._reset()
            raise error
        if seq in self.nacked:
            raise MessageNacked()

    @_channel_op
    def confirm_select(self, nowait: bool = False) -> None:
        if self.transaction is not None:
            raise PreconditionFailed("PRECONDITION_FAILED - cannot switch from tx to confirm mode",
                                     spec.Confirm.Select, reply_code=406)
        self.confirm = True

    @_channel_op
    def basic_qos(self, prefetch_size: int = 0, prefetch_count: int = 0, a_global: bool = False) -> None:
        if self.broker.profile.qos_is_global(a_global):  # RabbitMQ 4.3 applies global QoS per consumer
            self.global_prefetch = int(prefetch_count)
        else:
            self.prefetch = int(prefetch_count)

    @_channel_op
    def basic_consume(self, queue: str = "", consumer_tag: str = "", no_local: bool = False,
                      no_ack: bool = False, exclusive: bool = False, nowait: bool = False,
                      callback: Optional[Callable[[Any], Any]] = None, arguments: Optional[dict[str, Any]] = None,
                      on_cancel: Any = None, **_: Any) -> str:
        tag = consumer_tag or token("amq.ctag-")
        self.connection.claim()
        if callback is not None:
            self.callbacks[tag] = callback
        if no_ack:
            self.no_ack_consumers.add(tag)
        try:
            return self.broker.consume(self, queue, tag, no_ack=no_ack, exclusive=exclusive, arguments=arguments)
        except Exception:
            self.callbacks.pop(tag, None)
            self.no_ack_consumers.discard(tag)
            raise

    @_channel_op
    def basic_cancel(self, consumer_tag: str, nowait: bool = False) -> None:
        self.broker.cancel(self, consumer_tag)
        self.callbacks.pop(consumer_tag, None)
        self.no_ack_consumers.discard(consumer_tag)

    @_channel_op
    def basic_get(self, queue: str = "", no_ack: bool = False, **_: Any) -> Optional[AmqpMessage]:
        got = self.broker.get(self, queue, no_ack=no_ack)
        if got is None:
            return None
        tag, stored, left = got
        raw = self._content(stored)
        raw.delivery_info = {"delivery_tag": tag, "redelivered": stored.redelivered,
                             "exchange": stored.exchange, "routing_key": stored.routing_key, "message_count": left}
        return raw

    @_no_reply_op
    def basic_ack(self, delivery_tag: int, multiple: bool = False, **_: Any) -> None:
        self._transacted(self.broker.resolve, self, delivery_tag, multiple=multiple, outcome="ack")

    @_no_reply_op
    def basic_reject(self, delivery_tag: int, requeue: bool = True, **_: Any) -> None:
        self._transacted(self.broker.resolve, self, delivery_tag, multiple=False,
                         outcome="requeue" if requeue else "reject")

    @_no_reply_op
    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True, **_: Any) -> None:
        self._transacted(self.broker.resolve, self, delivery_tag, multiple=multiple,
                         outcome="requeue" if requeue else "reject")

    @_channel_op
    def basic_recover(self, requeue: bool = True) -> None:
        self.broker.resolve(self, 0, multiple=True, outcome="requeue")

    def flow(self, active: bool = True) -> None:
        """Accepted and ignored: the simulator never throttles."""

    def close(self) -> None:
        """Close the channel: cancel its consumers and requeue what it has not acked."""
        if self.closed and self.connection is None:
            return
        self.broker.close_channel(self)
        self.closed = True
        if self.connection is not None:
            self.connection.close_channel(self)
