"""The relay: consume expired messages and deliver, hop or park each, acked after confirm."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kombu import Consumer, Queue
from kombu.compression import compress
from kombu.mixins import ConsumerMixin

from .contract import CONTROL, EXCHANGE, PARKED_AT, PARKED_REASON, PARKING, PREFETCH
from .envelope import Deliver, Hop, Park, decide, scheduled_headers, strip_death
from .targets import ExchangeCheck
from .topology import declare

__all__ = ["Counters", "RelayCore", "Relay", "AllowList"]

logger = logging.getLogger(__name__)

W_PARKED = "parked a message from %s: %s"
W_LATE_RETURN = "a delivery to %r/%r was returned after its confirm; parking the returned copy"
W_NACKED = "broker refused (nack) a republish; the expired message goes back to %s"
I_COUNTERS = "relay counters: %s"

#: AMQP properties read off a consumed message (besides its headers).
_PROPERTY_NAMES = (
    "content_type", "content_encoding", "correlation_id", "reply_to", "message_id",
    "priority", "timestamp", "type", "app_id", "cluster_id", "delivery_mode",
)


class AllowList:
    """Which target exchanges a relay may deliver to.

    ``None`` (the default) allows every exchange. Otherwise only the exact
    names given are allowed; ``""`` stands for the default exchange.
    """

    def __init__(self, exchanges: Optional[Iterable[str]] = None) -> None:
        if isinstance(exchanges, str):
            raise TypeError("allowed_exchanges must be an iterable of exchange names, not a str")
        self.exchanges = None if exchanges is None else frozenset(exchanges)

    def __call__(self, exchange: str) -> bool:
        return self.exchanges is None or exchange in self.exchanges

    def __repr__(self) -> str:
        return f"AllowList({'*' if self.exchanges is None else sorted(self.exchanges)!r})"


@dataclass
class Counters:
    """What a relay has done. Read from any thread; written by the relay's."""

    #: Expired messages received from the control queue.
    received: int = 0
    #: Messages delivered to their target (confirmed by the broker).
    delivered: int = 0
    #: Times a message was put back into a rung (confirmed).
    hops: int = 0
    #: Messages without valid schedule headers (they are parked, never dropped).
    malformed: int = 0
    #: Messages parked: malformed, unroutable or refused by the allow-list (confirmed).
    parked: int = 0

    def as_dict(self) -> dict[str, int]:
        """Return the counters as a plain dict."""
        return {
            "received": self.received,
            "delivered": self.delivered,
            "hops": self.hops,
            "malformed": self.malformed,
            "parked": self.parked,
        }


@dataclass
class _Pending:
    """One unconfirmed publish (by confirm sequence number)."""

    source: Any  #: the consumed message it settles, or None for a park after a return
    kind: str  #: "deliver", "hop" or "park"
    exchange: str = ""
    routing_key: str = ""
    body: Any = None
    confirmed: bool = False
    returned: bool = False
    settled: bool = False  #: the source was already rejected back to the queue
    waiting_on: Optional[int] = None  #: seq of the park that replaces a returned delivery
    parent: Optional[int] = None  #: for a park after a return: the delivery it replaces
    extra: dict[str, Any] = field(default_factory=dict)


class RelayCore:
    """The relay's logic on one channel, independent of how it is driven.

    :meth:`consumer` puts a channel into confirm mode and returns the kombu
    consumer of the control queue. Each expired message is published exactly
    once (a delivery, a hop or a parking) and acked only after the broker
    confirms that publish; confirms are pipelined across the prefetch window.
    A standalone :class:`Relay` and the Celery bootstep both drive this class.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        counters: Optional[Counters] = None,
        exchange_check: Optional[Callable[[str], Optional[str]]] = None,
    ) -> None:
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1:
            raise ValueError(f"prefetch must be a positive integer, not {prefetch!r}")
        self.clock = clock
        self.prefetch = prefetch
        self.allow = AllowList(allowed_exchanges)
        self.counters = counters if counters is not None else Counters()
        #: Returns why a target exchange cannot be published to (None if it can); see ExchangeCheck.
        self.exchange_check = exchange_check
        self.channel: Any = None
        self._pending: "OrderedDict[int, _Pending]" = OrderedDict()
        self._seq = 0
        self._confirms = False

    # -- setup ---------------------------------------------------------------

    def consumer(self, channel: Any) -> Consumer:
        """Bind to ``channel`` (confirm mode, return handlers) and return the consumer."""
        self.channel = channel
        self._pending.clear()
        self._seq = 0
        self._confirms = hasattr(channel, "confirm_select") and hasattr(channel, "events")
        if self._confirms:
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            channel.events["basic_return"].add(self._on_return)
        else:
            logger.warning("transport of %r has no publisher confirms; republishes are not confirmed", channel)
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
        properties = _properties_of(message)
        decision = decide(headers, properties, int(self.clock() * 1000), allow_exchange=self.allow)
        if isinstance(decision, Deliver) and decision.exchange and self.exchange_check is not None:
            # A publish to a missing exchange is not returned: it kills the channel (404), and the
            # expired message would come back and kill it again, forever.
            problem = self.exchange_check(decision.exchange)
            if problem is not None:
                decision = Park(f"unroutable: target exchange {decision.exchange!r} cannot be published to: "
                                f"{problem} (routing_key={decision.routing_key!r})")
        if isinstance(decision, Deliver):
            self._publish(_Pending(message, "deliver", decision.exchange, decision.routing_key, _body_of(message)),
                          decision.headers, decision.properties, mandatory=True)
        elif isinstance(decision, Hop):
            # Mandatory too: a hop into a rung deleted under the relay is returned and parked, not lost.
            self._publish(_Pending(message, "hop", EXCHANGE, decision.queue, _body_of(message)),
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
        owner = source if parent is None else None  # a park after a return settles via its parent
        return self._publish(_Pending(owner, "park", "", PARKING, None, parent=parent),
                             parked_headers, props, mandatory=False,
                             body=_body_of(source) if body is None else body)

    def _publish(self, entry: _Pending, headers: dict[str, Any], properties: dict[str, Any],
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
        self._seq += 1
        seq = self._seq
        self._pending[seq] = entry  # recorded first: a transport may confirm synchronously
        _publish_no_wait(channel, message, entry.exchange, entry.routing_key, mandatory)
        if not self._confirms:
            self._on_ack(seq, False)
        return seq

    # -- confirms --------------------------------------------------------------

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        for seq in self._seqs(delivery_tag, multiple):
            self._pending[seq].confirmed = True
        self._release()

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        for seq in self._seqs(delivery_tag, multiple):
            entry = self._pending[seq]
            owner = self._pending.get(entry.parent) if entry.parent is not None else entry
            if owner is not None and owner.source is not None and not owner.settled:
                logger.warning(W_NACKED, CONTROL)
                owner.source.requeue()
                owner.settled = True
            entry.confirmed = True
            entry.settled = True
        self._release()

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        body = getattr(message, "body", None)
        for seq, entry in self._pending.items():
            if (entry.kind in ("deliver", "hop") and not entry.returned and not entry.confirmed
                    and entry.exchange == exchange and entry.routing_key == routing_key
                    and entry.body == body):
                entry.returned = True
                entry.waiting_on = self._seq + 1  # linked before publishing: confirms may come at once
                source = entry.source
                reason = (f"unroutable: {getattr(exc, 'reply_text', exc)} "
                          f"(exchange={exchange!r}, routing_key={routing_key!r})")
                self._park(source, Park(reason), source.headers, _properties_of(source), parent=seq)
                return
        self._park_late_return(exc, exchange, routing_key, message)

    def _park_late_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        """Park a returned copy whose delivery was already confirmed, and so acked.

        RabbitMQ 3.10 was seen returning several unroutable messages of one batch
        in reverse order, so a return can arrive after the confirm that released
        its source. The returned copy is then all that is left: park it, with the
        target put back in ``x-schedule-*`` headers so that ``replay`` works.
        """
        logger.warning(W_LATE_RETURN, exchange, routing_key)
        raw = dict(getattr(message, "properties", None) or {})
        headers = dict(raw.pop("application_headers", None) or {})
        properties = {k: raw[k] for k in _PROPERTY_NAMES if raw.get(k) is not None}
        reason = (f"unroutable: {getattr(exc, 'reply_text', exc)} "
                  f"(exchange={exchange!r}, routing_key={routing_key!r})")
        if exchange == EXCHANGE:  # a hop into a missing rung: its x-schedule-* headers are intact
            self.counters.hops -= 1
            self._park(None, Park(reason), headers, properties, body=message.body)
            return
        headers = scheduled_headers(headers, exchange=exchange, routing_key=routing_key,
                                    due_at=int(self.clock() * 1000),
                                    content_type=properties.get("content_type"))
        self.counters.delivered -= 1  # it was counted when its confirm came first
        self._park(None, Park(reason), headers, properties, body=message.body)

    def _seqs(self, delivery_tag: int, multiple: bool) -> list[int]:
        if multiple:
            return [seq for seq in self._pending if seq <= delivery_tag]
        return [delivery_tag] if delivery_tag in self._pending else []

    def _release(self) -> None:
        """Ack, in order, every source whose publishes are all confirmed."""
        last = None
        pending = self._pending
        while pending:
            seq, entry = next(iter(pending.items()))
            if not entry.confirmed:
                break
            if entry.waiting_on is not None:
                park = pending.get(entry.waiting_on)
                if park is not None and not park.confirmed:
                    break
            pending.popitem(last=False)
            if entry.settled:
                continue
            self._count(entry)
            if entry.source is not None:
                last = entry.source
        if last is not None:
            self.channel.basic_ack(last.delivery_tag, multiple=True)

    def _count(self, entry: _Pending) -> None:
        if entry.kind == "park":
            self.counters.parked += 1
        elif entry.returned:
            return
        elif entry.kind == "deliver":
            self.counters.delivered += 1
        else:
            self.counters.hops += 1


def _properties_of(message: Any) -> dict[str, Any]:
    raw = getattr(message, "properties", None) or {}
    out = {k: raw.get(k) for k in _PROPERTY_NAMES if raw.get(k) is not None}
    if message.content_type and "content_type" not in out:
        out["content_type"] = message.content_type
    if message.content_encoding and "content_encoding" not in out:
        out["content_encoding"] = message.content_encoding
    return out


def _body_of(message: Any) -> Any:
    """The body as it travelled: kombu decompresses a message with a ``compression``
    header on receipt, so the relay compresses it again before republishing it
    with that header (kombu's codecs are deterministic: the same bytes come back)."""
    body = message.body
    compression = (message.headers or {}).get("compression") if isinstance(message.headers, dict) else None
    if compression and not getattr(message, "errors", None):
        body, _ = compress(body.encode("utf-8") if isinstance(body, str) else body, compression)
    return body


def _publish_no_wait(channel: Any, message: Any, exchange: str, routing_key: str, mandatory: bool) -> None:
    """Publish without waiting for the confirm, even where the connection was opened
    with ``confirm_publish`` (py-amqp then swaps in a blocking ``basic_publish``)."""
    publish = type(channel).basic_publish
    publish(channel, message, exchange=exchange, routing_key=routing_key, mandatory=mandatory)


class Relay(ConsumerMixin):
    """A standalone relay on its own connection; reconnects by itself.

    Run it with :meth:`run` (blocking) and stop it from another thread or a
    signal handler with :meth:`stop`.
    """

    def __init__(
        self,
        connection: Any,
        *,
        clock: Callable[[], float] = time.time,
        prefetch: int = PREFETCH,
        allowed_exchanges: Optional[Iterable[str]] = None,
        report_every: Optional[float] = None,
    ) -> None:
        self.connection = connection
        self.exchange_check = ExchangeCheck(connection.clone())
        self.core = RelayCore(clock=clock, prefetch=prefetch, allowed_exchanges=allowed_exchanges,
                              exchange_check=self.exchange_check)
        self.report_every = report_every
        self._last_report = time.monotonic()
        self.ready = threading.Event()

    @property
    def counters(self) -> Counters:
        """The relay's counters."""
        return self.core.counters

    def run(self, _tokens: int = 1, **kwargs: Any) -> None:
        """Consume until :meth:`stop`, reconnecting as needed (kombu's ConsumerMixin loop)."""
        try:
            super().run(_tokens, **kwargs)
        finally:
            self.exchange_check.close()

    def get_consumers(self, Consumer: Any, channel: Any) -> list[Any]:  # noqa: N803 - kombu's name
        self.exchange_check.forget()  # (re)connecting: an exchange may have gone meanwhile
        declare(channel)
        return [self.core.consumer(channel)]

    def on_consume_ready(self, connection: Any, channel: Any, consumers: Any, **kwargs: Any) -> None:
        logger.info("relay consuming from %s (prefetch %d)", CONTROL, self.core.prefetch)
        self.ready.set()

    def on_iteration(self) -> None:
        if self.report_every is not None and time.monotonic() - self._last_report >= self.report_every:
            self._last_report = time.monotonic()
            logger.info(I_COUNTERS, self.counters.as_dict())

    def on_consume_end(self, connection: Any, channel: Any) -> None:
        """Wait briefly for outstanding confirms, so a clean stop duplicates nothing."""
        deadline = time.monotonic() + 5
        while self.core.outstanding and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=0.2)
            except Exception:  # noqa: BLE001 - timeout or a dying connection ends the wait
                if not self.core.outstanding:
                    break
                if time.monotonic() >= deadline:
                    break
        logger.info(I_COUNTERS, self.counters.as_dict())

    def stop(self) -> None:
        """Ask the relay to stop; :meth:`run` returns within about a second."""
        self.should_stop = True
