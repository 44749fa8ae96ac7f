"""Publishing into the simulated broker: checks, routing through exchanges, enqueueing, and the confirms."""

from __future__ import annotations

from typing import Any, Callable, Optional

from amqp import spec
from amqp.exceptions import AccessRefused, ChannelError, PreconditionFailed

from . import streams
from .client_codec import decode_raw
from .entities import SimExchange, SimQueue, Stored

__all__ = ["Routing"]


class Routing:
    """The publishing half of :class:`~.core.BrokerCore` (mixed into it, which owns the state)."""

    lock: Any
    cond: Any
    clock: Any
    vhost: str
    record: bool
    expiry_lag: int
    max_message_size: int
    permissions: Any
    stats: Any
    exchanges: dict[str, SimExchange]
    queues: dict[str, SimQueue]
    _arrivals: Any
    _exchange: Callable[[str, Any], SimExchange]
    _dead_letter: Callable[[SimQueue, Stored, str], None]
    dispatch: Callable[..., None]

    # -- publishing -----------------------------------------------------------

    def publish(self, channel: Any, body: bytes, raw: bytes, exchange: str, routing_key: str, *,
                mandatory: bool = False) -> None:
        """Route one message (``raw``: its encoded properties); post the return and the confirm.

        As on RabbitMQ, a publish the broker refuses (a missing or internal
        exchange, no write permission, a bad expiration) closes the channel:
        the close comes as a frame, and later publishes on that channel are
        dropped. An unroutable publish is confirmed at once (after its return);
        a routed one when its queues have taken it, which is later (see
        :meth:`flush_confirms`): confirms can come out of order.
        """
        with self.lock:
            if channel.closing is not None:
                return  # RabbitMQ drops every method of a channel it is closing
            seq = channel.next_publish_seq() if channel.confirm else None
            properties, undecodable = decode_raw(raw)
            try:
                if len(body) > self.max_message_size:
                    raise PreconditionFailed(f"PRECONDITION_FAILED - message size {len(body)} is larger than "
                                             f"configured max size {self.max_message_size}", spec.Basic.Publish,
                                             reply_code=406)
                self._check_publish(exchange, properties.get("expiration"), properties.get("user_id"))
            except ChannelError as exc:
                channel.broker_closed(exc)
                self.cond.notify_all()
                return
            self.stats["published"] += 1
            targets = self._route(exchange, routing_key, properties.get("application_headers") or {})
            accepted = True
            if not targets:
                self.stats["unroutable"] += 1
                if mandatory:
                    self.stats["returned"] += 1
                    channel.post_return(312, "NO_ROUTE", exchange, routing_key, body, properties, raw)
                if seq is not None:
                    channel.post_confirm(seq, True)
                return
            for queue in targets:
                stored = Stored(body, properties, exchange, routing_key, raw=raw, undecodable=undecodable)
                accepted = self._enqueue(queue, stored) and accepted
            if seq is not None:
                channel.deferred.append((seq, accepted))

    def _check_publish(self, exchange: str, expiration: Any, user_id: Any) -> None:
        method = spec.Basic.Publish
        if user_id is not None and user_id != self.permissions.user:
            raise PreconditionFailed(f"PRECONDITION_FAILED - user_id property set to '{user_id}' but authenticated "
                                     f"user was '{self.permissions.user}'", method, reply_code=406)
        self.permissions.check("write", "exchange", exchange, method)
        if exchange and self._exchange(exchange, method).internal:
            raise AccessRefused(f"ACCESS_REFUSED - cannot publish to internal exchange '{exchange}' in vhost "
                                f"'{self.vhost}'", method, reply_code=403)
        if expiration is not None and not (isinstance(expiration, str) and expiration.isdigit()
                                           and expiration.isascii()):
            raise PreconditionFailed(f"PRECONDITION_FAILED - invalid expiration '{expiration}' for message",
                                     method, reply_code=406)

    def flush_confirms(self, connection: Any) -> None:
        """Confirm the routed publishes of ``connection``'s channels: their queues have taken them."""
        with self.lock:
            for channel in list(getattr(connection, "channels", ())):
                deferred = getattr(channel, "deferred", None)
                while deferred:
                    channel.post_confirm(*deferred.pop(0))

    def _route(self, exchange: str, routing_key: str, headers: dict[str, Any]) -> list[SimQueue]:
        if not exchange:
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        found: dict[str, SimQueue] = {}
        seen: set[str] = set()
        pending = [exchange]
        while pending:
            source = self.exchanges.get(pending.pop(0))
            if source is None or source.name in seen:
                continue
            seen.add(source.name)
            for binding in source.bindings:
                if not source.matches(binding, routing_key, headers):
                    continue
                if binding.to_exchange:
                    pending.append(binding.destination)
                elif binding.destination in self.queues:
                    found.setdefault(binding.destination, self.queues[binding.destination])
        return list(found.values())

    def _enqueue(self, queue: SimQueue, message: Stored) -> bool:
        """Append to ``queue`` with its expiry; False when ``x-overflow`` refuses it."""
        if streams.is_stream(queue):
            return streams.append(self, queue, message)
        ttls = [t for t in (queue.ttl, _expiration_ms(message.properties)) if t is not None]
        ttl = min(ttls) if ttls else None
        message.expires_at = None if ttl is None else self.clock.ms + ttl + (self.expiry_lag if ttl else 0)
        overflow = queue.arguments.get("x-overflow", "drop-head")
        if overflow != "drop-head" and queue.over_limit(extra=1, extra_bytes=len(message.body)):
            if overflow == "reject-publish-dlx":
                self._dead_letter(queue, message, "maxlen")
            return False
        queue.ready.append(message)
        if self.record:
            self._arrivals[queue.name].append((self.clock.ms, message))
        while overflow == "drop-head" and queue.ready and queue.over_limit():
            self._dead_letter(queue, queue.ready.popleft(), "maxlen")
        self.dispatch(queue, fresh=message)
        return True


def _expiration_ms(properties: dict[str, Any]) -> Optional[int]:
    value = properties.get("expiration")
    return int(value) if value is not None else None
