"""The broker's state machine: route, enqueue, deliver, acknowledge and dead-letter."""

from __future__ import annotations

import logging
import threading
from collections import Counter, defaultdict
from typing import Any, Iterable, Optional

from amqp import spec
from amqp.exceptions import AccessRefused, PreconditionFailed

from . import streams
from .client_codec import with_headers
from .clock import VirtualClock
from .deadletter import dead_letter_headers, is_cycle
from .declarations import INTERNAL, PREDECLARED, Declarations, token
from .entities import ConsumerRef, SimExchange, SimQueue, Stored
from .permissions import Permissions
from .routing import Routing

__all__ = ["BrokerCore", "PREDECLARED"]

logger = logging.getLogger(__name__)

class BrokerCore(Routing, Declarations):
    """Exchanges, queues and messages, with RabbitMQ's rules; every method takes the lock."""

    def __init__(self, clock: VirtualClock, *, vhost: str = "/", record: bool = True, expiry_lag: int = 0) -> None:
        self.clock = clock
        #: RabbitMQ's ``max_message_size`` (bytes of body): a bigger publish closes the channel (406).
        self.max_message_size = 128 * 1024 * 1024
        #: Milliseconds a message with a TTL expires after it is due (RabbitMQ: a few ms).
        self.expiry_lag = expiry_lag
        self.vhost = vhost
        self.record = record
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.exchanges: dict[str, SimExchange] = {
            name: SimExchange(name, kind, durable=True, internal=name in INTERNAL) for name, kind in PREDECLARED.items()
        }
        #: The simulated user's permissions in the vhost (everything, unless set otherwise).
        self.permissions = Permissions(vhost)
        self.queues: dict[str, SimQueue] = {}
        self.connections: set[Any] = set()
        #: What happened, for tests and the demo: published, unroutable, returned,
        #: delivered, acked, requeued, expired, dead_lettered, dropped.
        self.stats: Counter[str] = Counter()
        self._arrivals: dict[str, list[tuple[int, Stored]]] = defaultdict(list)

    # -- delivery -------------------------------------------------------------

    def dispatch(self, queue: SimQueue, fresh: Optional[Stored] = None) -> None:
        """Expire what is due at the head of ``queue``, then hand messages to consumers.

        A message expires only at the head of the queue, as in RabbitMQ's
        classic queues. A message published with a TTL of 0 is still delivered
        when a consumer can take it at once.
        """
        if streams.is_stream(queue):
            return streams.dispatch(self, queue)
        now = self.clock.ms
        ready = queue.ready
        while ready and self.is_live(queue):
            head = ready[0]
            expired = head.expires_at is not None and head.expires_at <= now
            if expired and head is not fresh:
                ready.popleft()
                self.stats["expired"] += 1
                self._dead_letter(queue, head, "expired")
                continue
            ref = queue.next_consumer()
            if ref is None:
                if expired:
                    ready.popleft()
                    self.stats["expired"] += 1
                    self._dead_letter(queue, head, "expired")
                    continue
                return
            ready.popleft()
            self._deliver(queue, ref, head)

    def is_live(self, queue: SimQueue) -> bool:
        """Whether ``queue`` is still declared (and not a deleted namesake)."""
        return self.queues.get(queue.name) is queue

    def _deliver(self, queue: SimQueue, ref: ConsumerRef, message: Stored) -> None:
        channel = ref.channel
        tag = channel.next_delivery_tag()
        if not ref.no_ack:
            channel.unacked[tag] = (queue, message, ref)
            ref.unacked += 1
        self.stats["delivered"] += 1
        channel.post_delivery(ref.tag, tag, message)

    def consume(self, channel: Any, queue_name: str, tag: str, *, no_ack: bool, exclusive: bool = False,
                arguments: Optional[dict[str, Any]] = None) -> str:
        with self.lock:
            method = spec.Basic.Consume
            queue = self._queue(queue_name, method)
            self._check_owner(queue, channel, method)
            self.permissions.check("read", "queue", queue_name, method)
            if any(ref.exclusive for ref in queue.consumers) or (exclusive and queue.consumers):
                raise AccessRefused(f"ACCESS_REFUSED - queue '{queue_name}' in vhost '{self.vhost}' in exclusive use",
                                    method, reply_code=403)
            tag = tag or token("amq.ctag-")
            ref = ConsumerRef(channel, tag, bool(no_ack), channel.prefetch, bool(exclusive))
            if streams.is_stream(queue):
                ref.offset = streams.start_offset(queue, arguments)
            queue.consumers.append(ref)
            queue.had_consumers = True
            channel.consumers[tag] = (queue, ref)
            self.dispatch(queue)
            return tag

    def cancel(self, channel: Any, tag: str) -> None:
        with self.lock:
            entry = channel.consumers.pop(tag, None)
            if entry is None:
                return
            owner, ref = entry
            owner.consumers = [r for r in owner.consumers if r is not ref]
            if owner.auto_delete and owner.had_consumers and not owner.consumers \
                    and self.is_live(owner):
                self._delete_queue(owner)

    def get(self, channel: Any, queue_name: str, *, no_ack: bool) -> Optional[tuple[int, Stored, int]]:
        """basic.get: (delivery tag, message, messages left) or None when the queue is empty."""
        with self.lock:
            queue = self._queue(queue_name, spec.Basic.Get)
            self._check_owner(queue, channel, spec.Basic.Get)
            self.permissions.check("read", "queue", queue_name, spec.Basic.Get)
            now = self.clock.ms
            while queue.ready and queue.ready[0].expires_at is not None and queue.ready[0].expires_at <= now:
                self.stats["expired"] += 1
                self._dead_letter(queue, queue.ready.popleft(), "expired")
            if not queue.ready:
                return None
            message = queue.ready.popleft()
            tag = channel.next_delivery_tag()
            if not no_ack:
                channel.unacked[tag] = (queue, message, None)
            self.stats["delivered"] += 1
            return tag, message, len(queue.ready)

    def resolve(self, channel: Any, delivery_tag: int, *, multiple: bool, outcome: str) -> None:
        """Ack, requeue or reject (dead-letter) deliveries: ``outcome`` is ack, requeue or reject."""
        with self.lock:
            method = {"ack": spec.Basic.Ack, "requeue": spec.Basic.Reject, "reject": spec.Basic.Reject}[outcome]
            if multiple:
                tags = [t for t in channel.unacked if delivery_tag == 0 or t <= delivery_tag]
            else:
                tags = [delivery_tag]
            if (delivery_tag or not multiple) and delivery_tag not in channel.unacked:
                raise PreconditionFailed(f"PRECONDITION_FAILED - unknown delivery tag {delivery_tag}", method,
                                         reply_code=406)
            self._settle_tags(channel, tags, outcome)

    def _settle_tags(self, channel: Any, tags: Iterable[int], outcome: str) -> None:
        touched: dict[str, SimQueue] = {}
        for tag in tags:
            queue, message, ref = channel.unacked.pop(tag)
            if ref is not None:
                ref.unacked -= 1
            alive = self.is_live(queue)
            if outcome == "ack":
                self.stats["acked"] += 1
            elif outcome == "requeue" and alive and not streams.is_stream(queue):
                self.stats["requeued"] += 1
                queue.requeue(message)
            elif outcome == "reject" and not streams.is_stream(queue):
                self._dead_letter(queue, message, "rejected")
            if alive:
                touched[queue.name] = queue
        for queue in touched.values():
            self.dispatch(queue)
        for consumed, _ in list(channel.consumers.values()):
            if consumed.name not in touched and self.is_live(consumed):
                self.dispatch(consumed)

    def close_channel(self, channel: Any) -> None:
        """Cancel the channel's consumers and requeue what it had not acked."""
        with self.lock:
            if channel.closed:
                return
            channel.closed = True
            for tag in list(channel.consumers):
                self.cancel(channel, tag)
            self._settle_tags(channel, list(channel.unacked), "requeue")
            self.cond.notify_all()

    def close_connection(self, connection: Any, channels: Iterable[Any]) -> None:
        """Close every channel of ``connection`` and delete its exclusive queues."""
        with self.lock:
            for channel in channels:
                self.close_channel(channel)
            for queue in [q for q in self.queues.values() if q.exclusive and q.owner is connection]:
                self._delete_queue(queue)
            self.connections.discard(connection)
            self.cond.notify_all()

    # -- dead-lettering -------------------------------------------------------

    def _dead_letter(self, queue: SimQueue, message: Stored, reason: str) -> None:
        exchange = queue.arguments.get("x-dead-letter-exchange")
        if exchange is None or (exchange and exchange not in self.exchanges):
            self.stats["dropped"] += 1
            logger.debug("dropped a message %s in %s (no dead-letter exchange)", reason, queue.name)
            return
        key = queue.arguments.get("x-dead-letter-routing-key")
        keys = [key] if key is not None else [message.routing_key]
        properties = dict(message.properties)
        expiration = properties.pop("expiration", None)
        old = properties.get("application_headers")
        headers = properties["application_headers"] = dead_letter_headers(
            old if isinstance(old, dict) else None, queue=queue.name, reason=reason, exchange=message.exchange,
            routing_keys=[message.routing_key], now_ms=self.clock.ms, original_expiration=expiration,
            last_death=self.profile.last_death_headers)
        # RabbitMQ rewrites only these headers: every other keeps its bytes (and its type).
        changed = {k: v for k, v in headers.items()
                   if k == "x-death" or k.startswith(("x-first-death-", "x-last-death-"))}
        raw = with_headers(message.raw, changed, drop=("expiration",))
        self.stats["dead_lettered"] += 1
        for routing_key in keys:
            for target in self._route(exchange, routing_key, headers):
                if is_cycle(target.name, reason, headers):
                    self.stats["dropped"] += 1
                    continue
                self._enqueue(target, Stored(message.body, properties, exchange, routing_key, raw=raw,
                                             undecodable=message.undecodable))

