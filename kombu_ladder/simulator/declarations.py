"""Declaring exchanges, queues and bindings with RabbitMQ's checks and error texts."""

from __future__ import annotations

import base64
import os
from typing import Any, Optional

from amqp import spec
from amqp.exceptions import AccessRefused, InvalidCommand, NotFound, PreconditionFailed, ResourceLocked

from . import streams
from .client_codec import round_trip_table
from .entities import (
    EXCHANGE_TYPES,
    QUEUE_ARGUMENT_KEYS,
    Binding,
    SimExchange,
    SimQueue,
    check_equivalent,
    check_queue_arguments,
)
from .profiles import DEFAULT, PROFILES, Profile

__all__ = ["Declarations", "PREDECLARED", "INTERNAL", "token"]

#: The exchanges every RabbitMQ vhost has: name -> type.
PREDECLARED = {"amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
               "amq.headers": "headers", "amq.match": "headers", "amq.rabbitmq.trace": "topic"}

#: Those of them that are internal: a publish to one closes the channel with 403.
INTERNAL = frozenset({"amq.rabbitmq.trace"})


def token(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Declarations:
    """The declaring half of the broker (mixed into :class:`~.core.BrokerCore`, which owns the state)."""

    vhost: str
    lock: Any
    #: The RabbitMQ release whose refusals apply (see :mod:`.profiles`).
    profile: Profile = PROFILES[DEFAULT]
    exchanges: dict[str, SimExchange]
    queues: dict[str, SimQueue]
    permissions: Any

    # -- lookups --------------------------------------------------------------

    def _queue(self, name: str, method: Any) -> SimQueue:
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"NOT_FOUND - no queue '{name}' in vhost '{self.vhost}'", method, reply_code=404)
        return queue

    def _exchange(self, name: str, method: Any) -> SimExchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"NOT_FOUND - no exchange '{name}' in vhost '{self.vhost}'", method, reply_code=404)
        return exchange

    def _check_owner(self, queue: SimQueue, channel: Any, method: Any) -> None:
        if queue.exclusive and queue.owner is not channel.connection:
            raise ResourceLocked(
                f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue.name}' in vhost "
                f"'{self.vhost}'. It could be originally declared on another connection or the exclusive "
                "property value does not match that of the original declaration.", method, reply_code=405)

    # -- exchanges ------------------------------------------------------------

    def exchange_declare(self, channel: Any, name: str, type: str, *, durable: bool, auto_delete: bool,
                         internal: bool = False, arguments: Optional[dict[str, Any]] = None,
                         passive: bool = False) -> None:
        with self.lock:
            method = spec.Exchange.Declare
            if not name:
                raise AccessRefused("ACCESS_REFUSED - operation not permitted on the default exchange",
                                    method, reply_code=403)
            if passive:
                if self.profile.passive_needs_permission:
                    self.permissions.check_any("exchange", name, method)
                self._exchange(name, method)
                return
            self.permissions.check("configure", "exchange", name, method)
            existing = self.exchanges.get(name)
            wanted = {"type": type, "durable": bool(durable), "auto_delete": bool(auto_delete),
                      "internal": bool(internal)}
            if existing is not None:
                current = {"type": existing.type, "durable": existing.durable,
                           "auto_delete": existing.auto_delete, "internal": existing.internal}
                check_equivalent("exchange", name, self.vhost, current, wanted, method)
                return
            if name.startswith("amq."):
                raise AccessRefused(f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'",
                                    method, reply_code=403)
            if type not in EXCHANGE_TYPES:
                raise InvalidCommand(f"COMMAND_INVALID - unknown exchange type '{type}'", method, reply_code=503)
            self.exchanges[name] = SimExchange(name, type, bool(durable), bool(auto_delete), bool(internal),
                                               round_trip_table(arguments))

    def exchange_delete(self, name: str, *, if_unused: bool = False) -> None:
        with self.lock:
            method = spec.Exchange.Delete
            if name in PREDECLARED or not name:
                raise AccessRefused(f"ACCESS_REFUSED - operation not permitted on the exchange '{name}'",
                                    method, reply_code=403)
            exchange = self.exchanges.get(name)
            if exchange is None:
                return
            if if_unused and exchange.bindings:
                raise PreconditionFailed(f"PRECONDITION_FAILED - exchange '{name}' in vhost '{self.vhost}' in use",
                                         method, reply_code=406)
            del self.exchanges[name]
            for other in self.exchanges.values():
                other.bindings = [b for b in other.bindings if not (b.to_exchange and b.destination == name)]

    def bind(self, exchange: str, destination: str, routing_key: str, arguments: Optional[dict[str, Any]],
             *, to_exchange: bool = False, unbind: bool = False) -> None:
        """Bind (or unbind) a queue, or with ``to_exchange`` an exchange, to ``exchange``."""
        with self.lock:
            method = (spec.Exchange.Bind if to_exchange else spec.Queue.Bind) if not unbind else \
                (spec.Exchange.Unbind if to_exchange else spec.Queue.Unbind)
            if not exchange:
                raise AccessRefused("ACCESS_REFUSED - operation not permitted on the default exchange",
                                    method, reply_code=403)
            self.permissions.check("write", "exchange" if to_exchange else "queue", destination, method)
            self.permissions.check("read", "exchange", exchange, method)
            binding = Binding(destination, routing_key or "", tuple(sorted(round_trip_table(arguments).items())),
                              to_exchange)
            if unbind:  # RabbitMQ unbinds what does not exist without a word, missing exchanges included
                source = self.exchanges.get(exchange)
                if source is None:
                    return
                source.bindings = [b for b in source.bindings if b != binding]
                if source.auto_delete and not source.bindings:
                    del self.exchanges[source.name]
                return
            if to_exchange:
                self._exchange(destination, method)
            else:
                self._queue(destination, method)
            source = self._exchange(exchange, method)
            if binding not in source.bindings:
                source.bindings.append(binding)

    # -- queues ---------------------------------------------------------------

    def queue_declare(self, channel: Any, name: str, *, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: Optional[dict[str, Any]] = None) -> tuple[str, int, int]:
        with self.lock:
            method = spec.Queue.Declare
            if passive:
                if self.profile.passive_needs_permission:
                    self.permissions.check_any("queue", name, method)
                queue = self._queue(name, method)
                self._check_owner(queue, channel, method)
                return queue.name, _count(queue), len(queue.consumers)
            generated = not name
            if generated:
                name = token("amq.gen-")
            self.permissions.check("configure", "queue", name, method)
            arguments = round_trip_table(arguments)
            existing = self.queues.get(name)
            self.profile.check_queue_declare(name, self.vhost, durable=bool(durable), exclusive=bool(exclusive),
                                             arguments=arguments, new=existing is None)
            streams.check_declare(name, self.vhost, durable=bool(durable), exclusive=bool(exclusive),
                                  auto_delete=bool(auto_delete), arguments=arguments)
            if existing is not None:
                self._check_owner(existing, channel, method)
                keys = [k for k in QUEUE_ARGUMENT_KEYS if k in existing.arguments or k in arguments]
                current = {"durable": existing.durable, "auto_delete": existing.auto_delete,
                           **{k: existing.arguments.get(k) for k in keys}}
                received = {"durable": bool(durable), "auto_delete": bool(auto_delete), **arguments}
                check_equivalent("queue", name, self.vhost, current, received, method)
                return existing.name, _count(existing), len(existing.consumers)
            if name.startswith("amq.") and not generated:
                raise AccessRefused(f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'",
                                    method, reply_code=403)
            check_queue_arguments(name, self.vhost, arguments)
            self.queues[name] = SimQueue(name, bool(durable), bool(exclusive), bool(auto_delete), arguments,
                                         owner=channel.connection if exclusive else None)
            return name, 0, 0

    def queue_delete(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        with self.lock:
            method = spec.Queue.Delete
            queue = self.queues.get(name)
            if queue is None:
                return 0
            if if_unused and queue.consumers:
                raise PreconditionFailed(f"PRECONDITION_FAILED - queue '{name}' in vhost '{self.vhost}' in use",
                                         method, reply_code=406)
            if if_empty and queue.ready:
                raise PreconditionFailed(
                    f"PRECONDITION_FAILED - queue '{name}' in vhost '{self.vhost}' is not empty", method,
                    reply_code=406)
            self._delete_queue(queue)
            return len(queue.ready)

    def _delete_queue(self, queue: SimQueue) -> None:
        self.queues.pop(queue.name, None)
        for ref in queue.consumers:
            ref.channel.consumers.pop(ref.tag, None)
        queue.consumers = []
        for exchange in list(self.exchanges.values()):
            kept = [b for b in exchange.bindings if b.to_exchange or b.destination != queue.name]
            if len(kept) != len(exchange.bindings):
                exchange.bindings = kept
                if exchange.auto_delete and not kept:
                    del self.exchanges[exchange.name]

    def queue_purge(self, name: str) -> int:
        with self.lock:
            queue = self._queue(name, spec.Queue.Purge)
            count = len(queue.ready)
            queue.ready.clear()
            return count


def _count(queue: Any) -> int:
    """The message count a declare reports: the ready messages, or a stream's records (as RabbitMQ counts them)."""
    return len(queue.log) if streams.is_stream(queue) else len(queue.ready)
