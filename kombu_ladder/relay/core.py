"""RelayCore: one expired message becomes exactly one delivery, hop or parking, acked after confirm."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Optional

from amqp import spec
from amqp.channel import Channel as AmqpChannel
from amqp.exceptions import RecoverableConnectionError
from kombu import Consumer, Queue
from kombu.compression import compress

from ..contract import CONTROL, EXCHANGE, PARKED_AT, PARKED_REASON, PARKING, PREFETCH, RUNGS, rung_name
from ..envelope import Deliver, Hop, Park, decide, scheduled_headers, scheduled_properties, strip_death
from ..plan import MAX_DELAY, check_max_delay
from .counters import AllowList, Counters
from .pending import Entry, Pending

__all__ = ["RelayCore"]

logger = logging.getLogger("kombu_ladder.relay")

W_PARKED = "parked a message from %s: %s"
W_LATE_RETURN = "a delivery to %r/%r was returned after its confirm; parking the returned copy"
W_REFUSED = "broker refused (nack) a delivery to %r/%r; retrying it after the %s rung"
W_NACKED = "broker refused (nack) a republish; the expired message goes back to %s"
W_NO_CONFIRMS = "transport of %r has no publisher confirms; republishes are not confirmed"

#: AMQP properties read off a consumed message (besides its headers).
PROPERTY_NAMES = (
    "content_type", "content_encoding", "correlation_id", "reply_to", "message_id",
    "priority", "timestamp", "type", "app_id", "cluster_id", "delivery_mode",
)

#: The rung a refused delivery waits in before it is tried again.
RETRY_RUNG = RUNGS[-1]


class RelayCore:
    """The relay's logic on one channel, independent of how it is driven.

    :meth:`consumer` puts a channel into confirm mode and returns the kombu
    consumer of the control queue. Each expired message is published exactly
    once (a delivery, a hop or a parking) and acked only after the broker
    confirms that publish; confirms are pipelined across the prefetch window.
    A returned (unroutable) publish is replaced by a parking, a refused (nacked)
    delivery by a retry through the smallest rung; the expired message is acked
    only once the replacement is confirmed. The standalone
    :class:`~kombu_ladder.relay.Relay`, the Celery bootstep and the simulator
    all drive this class.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        counters: Optional[Counters] = None,
        exchange_check: Optional[Callable[[str], Optional[str]]] = None,
        max_delay: float = MAX_DELAY,
    ) -> None:
        #: A due time further ahead than this (ms) is parked as malformed: a unit mistake.
        self.max_delay_ms = round(check_max_delay(max_delay) * 1000)
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1:
            raise ValueError(f"prefetch must be a positive integer, not {prefetch!r}")
        self.clock = clock
        self.prefetch = prefetch
        self.allow = AllowList(allowed_exchanges)
        self.counters = counters if counters is not None else Counters()
        #: Returns why a target exchange cannot be published to (None if it can); see ExchangeCheck.
        self.exchange_check = exchange_check
        self.channel: Any = None
        self._pending = Pending()
        self._confirms = False

    def consumer(self, channel: Any) -> Consumer:
        """Bind to ``channel`` (confirm mode, return handlers) and return the consumer."""
        self.channel = channel
        self._pending.reset()
        self._confirms = hasattr(channel, "confirm_select") and hasattr(channel, "events")
        if self._confirms:
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            channel.events["basic_return"].add(self._on_return)
        else:
            logger.warning(W_NO_CONFIRMS, channel)
        return Consumer(
            channel,
            queues=[Queue(CONTROL, no_declare=True)],
            on_message=self.on_message,
            prefetch_count=self.prefetch,
            no_ack=False,
        )

    @property
    def outstanding(self) -> int:
        """Publishes not yet confirmed by the broker."""
        return len(self._pending)

    # -- one expired message ---------------------------------------------------

    def on_message(self, message: Any) -> None:
        """Handle one expired message from the control queue."""
        self.counters.received += 1
        headers = message.headers
        properties = properties_of(message)
        decision = decide(headers, properties, int(self.clock() * 1000), allow_exchange=self.allow,
                          max_delay_ms=self.max_delay_ms)
        if isinstance(decision, Deliver) and decision.exchange and self.exchange_check is not None:
            # A publish to a missing exchange is not returned: it kills the channel (404), and the
            # expired message would come back and kill it again, forever.
            problem = self.exchange_check(decision.exchange)
            if problem is not None:
                decision = Park(f"unroutable: target exchange {decision.exchange!r} cannot be published to: "
                                f"{problem} (routing_key={decision.routing_key!r})")
        if isinstance(decision, Deliver):
            self._publish(Entry(message, "deliver", decision.exchange, decision.routing_key, body_of(message)),
                          decision.headers, decision.properties, mandatory=True)
        elif isinstance(decision, Hop):
            # Mandatory too: a hop into a rung deleted under the relay is returned and parked, not lost.
            self._publish(Entry(message, "hop", EXCHANGE, decision.queue, body_of(message)),
                          decision.headers, decision.properties, mandatory=True)
        else:
            if decision.reason.startswith("malformed"):
                self.counters.malformed += 1
            self._park(message, decision, headers, properties)

    def _park(self, source: Any, decision: Park, headers: Any, properties: dict[str, Any],
              parent: Optional[int] = None, body: Any = None) -> int:
        logger.warning(W_PARKED, CONTROL, decision.reason)
        parked_headers = strip_death(headers) if isinstance(headers, dict) else {}
        parked_headers[PARKED_REASON] = decision.reason
        parked_headers[PARKED_AT] = int(self.clock() * 1000)
        props = {k: v for k, v in properties.items() if k != "delivery_mode"}
        props["delivery_mode"] = 2
        owner = source if parent is None else None  # a replacement settles through its parent
        return self._publish(Entry(owner, "park", "", PARKING, None, parent=parent),
                             parked_headers, props, mandatory=False,
                             body=body_of(source) if body is None else body)

    def _retry(self, source: Any, parent: int) -> int:
        """Put a refused delivery back into the smallest rung: it is tried again when that expires."""
        body = body_of(source)
        return self._publish(Entry(None, "hop", EXCHANGE, rung_name(RETRY_RUNG), body, parent=parent),
                             strip_death(source.headers), scheduled_properties(properties_of(source)),
                             mandatory=True)

    def _publish(self, entry: Entry, headers: dict[str, Any], properties: dict[str, Any],
                 *, mandatory: bool, body: Any = None) -> int:
        props = dict(properties)
        priority = props.pop("priority", None)
        content_type = props.pop("content_type", None)
        content_encoding = props.pop("content_encoding", None)
        channel = self.channel
        message = channel.prepare_message(
            entry.body if body is None else body, priority, content_type,
            content_encoding, headers, props,
        )
        seq = self._pending.add(entry)  # recorded first: a transport may confirm synchronously
        _publish_no_wait(channel, message, entry.exchange, entry.routing_key, mandatory)
        if not self._confirms:
            self._on_ack(seq, False)
        return seq

    # -- what the broker says about our publishes ------------------------------

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._pending.confirm(delivery_tag, multiple)
        self._release()

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        pending = self._pending
        for seq in pending.seqs(delivery_tag, multiple):
            entry = pending.get(seq)
            if entry is None:  # released by a handler this loop already ran
                continue
            entry.confirmed = entry.refused = True
            owner = entry if entry.parent is None else pending.get(entry.parent)
            if owner is None or owner.source is None or owner.settled:
                continue
            if entry is owner and entry.kind == "deliver" and not entry.returned:
                # Refused (a full target with reject-publish, say): retry after the smallest rung
                # instead of requeueing straight back into a tight loop.
                logger.warning(W_REFUSED, entry.exchange, entry.routing_key, rung_name(RETRY_RUNG))
                entry.waiting_on = pending.next_seq
                self._retry(entry.source, parent=seq)
                continue
            logger.warning(W_NACKED, CONTROL)
            owner.source.requeue()
            owner.settled = True
        self._release()

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        reason = (f"unroutable: {getattr(exc, 'reply_text', exc)} "
                  f"(exchange={exchange!r}, routing_key={routing_key!r})")
        found = self._pending.match_return(exchange, routing_key, getattr(message, "body", None))
        if found is None:
            self._park_late_return(reason, exchange, routing_key, message)
            return
        seq, entry = found
        entry.returned = True
        if entry.parent is not None:  # a retry's hop was returned: park for the original owner
            owner = self._pending.get(entry.parent)
            source = owner.source if owner is not None else None
        else:
            source = entry.source
        entry.waiting_on = self._pending.next_seq  # linked before publishing: confirms may come at once
        if source is None:
            self._park(None, Park(reason), _headers_of(message), _returned_properties(message),
                       parent=seq, body=message.body)
        else:
            self._park(source, Park(reason), source.headers, properties_of(source), parent=seq)

    def _park_late_return(self, reason: str, exchange: str, routing_key: str, message: Any) -> None:
        """Park a returned copy whose publish was already confirmed, and its source acked.

        A return normally comes before its confirm; should one come after (or
        fail to match), the returned copy is all that is left: park it, with the
        target put back in ``x-schedule-*`` headers so that ``replay`` works.
        """
        logger.warning(W_LATE_RETURN, exchange, routing_key)
        headers = _headers_of(message)
        properties = _returned_properties(message)
        if exchange == EXCHANGE:  # a hop into a missing rung: its x-schedule-* headers are intact
            self.counters.hops -= 1
        else:
            headers = scheduled_headers(headers, exchange=exchange, routing_key=routing_key,
                                        due_at=int(self.clock() * 1000),
                                        content_type=properties.get("content_type"))
            self.counters.delivered -= 1  # it was counted when its confirm came first
        self._park(None, Park(reason), headers, properties, body=message.body)

    def _release(self) -> None:
        """Ack, in order, every source whose publishes are all confirmed, and count them."""
        released, last = self._pending.release()
        for entry in released:
            self._count(entry)
        if last is not None:
            self.channel.basic_ack(last.delivery_tag, multiple=True)

    def _count(self, entry: Entry) -> None:
        if entry.kind == "park":
            self.counters.parked += 1
        elif entry.returned or entry.refused:
            return
        elif entry.kind == "deliver":
            self.counters.delivered += 1
        else:
            self.counters.hops += 1


def properties_of(message: Any) -> dict[str, Any]:
    """The AMQP properties of a consumed kombu message, as a plain dict."""
    raw = getattr(message, "properties", None) or {}
    out = {k: raw.get(k) for k in PROPERTY_NAMES if raw.get(k) is not None}
    if message.content_type and "content_type" not in out:
        out["content_type"] = message.content_type
    if message.content_encoding and "content_encoding" not in out:
        out["content_encoding"] = message.content_encoding
    return out


def _headers_of(returned: Any) -> dict[str, Any]:
    raw = getattr(returned, "properties", None) or {}
    return dict(raw.get("application_headers") or {})


def _returned_properties(returned: Any) -> dict[str, Any]:
    raw = getattr(returned, "properties", None) or {}
    return {k: raw[k] for k in PROPERTY_NAMES if raw.get(k) is not None}


def body_of(message: Any) -> Any:
    """The body as it travelled: kombu decompresses a message with a ``compression``
    header on receipt, so the relay compresses it again before republishing it
    with that header (kombu's codecs are deterministic: the same bytes come back)."""
    body = message.body
    compression = (message.headers or {}).get("compression") if isinstance(message.headers, dict) else None
    if compression and not getattr(message, "errors", None):
        body, _ = compress(body.encode("utf-8") if isinstance(body, str) else body, compression)
    return body


def _publish_no_wait(channel: Any, message: Any, exchange: str, routing_key: str, mandatory: bool) -> None:
    """Publish without waiting for the confirm and without reading from the socket.

    py-amqp's ``basic_publish`` first drains incoming frames (to notice
    ``connection.blocked``). Inside the relay that would run its handlers
    re-entrantly: a delivery handled there publishes *ahead* of the message
    being published, and the broker's confirm numbers no longer match the
    relay's. So on py-amqp the ``basic.publish`` method is sent directly; it
    also never waits for a confirm where the connection was opened with
    ``confirm_publish`` (py-amqp then swaps in a blocking ``basic_publish``).
    """
    if isinstance(channel, AmqpChannel):
        if not channel.connection:
            raise RecoverableConnectionError("basic_publish: connection closed")
        channel.send_method(spec.Basic.Publish, "Bssbb", (0, exchange, routing_key, mandatory, False), message)
        return
    publish = type(channel).basic_publish
    publish(channel, message, exchange=exchange, routing_key=routing_key, mandatory=mandatory)
