"""Whether the relay may publish to a target: names checked here, exchanges asked on a side connection."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from .contract import EXCHANGE
from .controlplane import is_control_plane
from .text import quote

__all__ = ["MAX_NAME", "INTERNAL_PREFIX", "ExchangeCheck", "name_problem", "is_internal", "own_name_problem"]

logger = logging.getLogger(__name__)

W_MISSING = "target exchange %s cannot be published to: %s"
W_UNCHECKED = "cannot check target exchange %s (%s); publishing anyway"

#: The longest exchange name or routing key AMQP can carry, in bytes of UTF-8 (a short string).
MAX_NAME = 255

#: RabbitMQ's own exchanges (``amq.rabbitmq.trace``, ``amq.rabbitmq.log``) are internal: a publish
#: to one closes the channel with 403.
INTERNAL_PREFIX = "amq.rabbitmq."

#: Routing key of the write probe: an unbind of a binding that does not exist.
PROBE_KEY = "kombu-ladder.write-probe"


def name_problem(what: str, name: str) -> Optional[str]:
    """Say why ``name`` (an exchange or a routing key, ``what`` says which) cannot go on the wire, or None."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME:
        return f"{what} is {size} bytes of UTF-8, longer than AMQP's {MAX_NAME}"
    return None


def is_internal(exchange: str) -> bool:
    """Whether ``exchange`` is one of RabbitMQ's own internal exchanges (publishing there closes the channel)."""
    return exchange.startswith(INTERNAL_PREFIX)


def own_name_problem(exchange: str, routing_key: str) -> Optional[tuple[str, str]]:
    """Say why a delivery to ``exchange`` with ``routing_key`` would land in the ladder itself, or None.

    The ladder's own names are never a delivery target: the exchange ``acemq.schedule``
    (it routes into the rungs and the control queue), every control-plane name (a
    record kind's exchange, a stream: :data:`kombu_ladder.controlplane.NAMES`), and,
    through the default exchange, a queue of the ladder's (``acemq.schedule.*``: the
    rungs, the control and parking queues) or a stream of the control plane. A delivery
    there would let whoever may schedule a message write a record, park a message or feed
    the control queue with the relay's rights.

    Returns:
        ``(argument, reason)``: which of ``"exchange"`` and ``"routing_key"`` is at fault, and why.
    """
    if exchange == EXCHANGE or is_control_plane(exchange):
        return "exchange", f"exchange {quote(exchange)} is the ladder's own, never a delivery target"
    if not exchange and (routing_key == EXCHANGE or is_control_plane(routing_key)
                         or routing_key.startswith(EXCHANGE + ".")):
        return "routing_key", (f"routing key {quote(routing_key)} names the ladder's own queue through the default "
                               f"exchange, never a delivery target")
    return None


class ExchangeCheck:
    """Ask the broker whether a target exchange may be published to, before a delivery.

    On RabbitMQ a publish to a missing exchange, to an internal one or to one
    the user may not write is not returned: it closes the channel (404 or 403).
    So the relay asks first, on a connection of its own (a clone, so that no
    frame of the relay's channels is read while it waits):

    * whether the exchange exists (a passive declare);
    * whether the user may write to it: an unbind of a binding that does not
      exist needs exactly the write permission a publish needs, and changes
      nothing.

    An exchange found usable is trusted for ``ttl`` seconds. One found unusable
    is refused without asking again while messages for it keep coming (less
    than ``negative_idle`` seconds apart) and for at most ``negative_ttl``
    seconds: a storm of messages to one missing exchange costs a question every
    few seconds, while a message replayed after the operator declared the
    exchange (the relay was idle meanwhile) is asked about afresh. What the broker
    refused on the relay's own channel (an internal exchange, say, which no
    question reveals) is remembered through :meth:`learn`. The default
    exchange ``""`` always exists.

    Calling the check returns ``None`` when the exchange can be published to,
    or the reason when it cannot.
    """

    #: How long (seconds) an exchange found usable is trusted without asking again.
    TTL = 60.0
    #: How long (seconds) an exchange found unusable is refused at most without asking again.
    NEGATIVE_TTL = 5.0
    #: ...provided messages for it keep coming less than this many seconds apart.
    NEGATIVE_IDLE = 0.25

    def __init__(self, connection: Any, *, ttl: float = TTL, negative_ttl: float = NEGATIVE_TTL,
                 negative_idle: float = NEGATIVE_IDLE, clock: Callable[[], float] = time.monotonic) -> None:
        self.connection = connection
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.negative_idle = negative_idle
        self._clock = clock
        #: exchange -> [answer good until, reason (None: usable), last asked or used, idle rule applies]
        self._known: dict[str, list[Any]] = {}
        #: Questions asked of the broker so far (each a round trip or two).
        self.asked = 0

    def __call__(self, exchange: str) -> Optional[str]:
        if not exchange:
            return None
        now = self._clock()
        known = self._known.get(exchange)
        if known is not None and now < known[0] and (not known[3] or now - known[2] < self.negative_idle):
            known[2] = now
            return known[1]  # type: ignore[no-any-return]
        self.asked += 1
        reason = self._ask(exchange)
        if reason is not None:
            logger.warning(W_MISSING, quote(exchange), reason)
        self._known[exchange] = [now + (self.ttl if reason is None else self.negative_ttl), reason, now,
                                 reason is not None]
        return reason

    def _ask(self, exchange: str) -> Optional[str]:
        conn = self.connection
        try:
            channel = conn.channel()
        except conn.connection_errors as exc:
            logger.warning(W_UNCHECKED, quote(exchange), quote(exc))
            return None
        try:
            channel.exchange_declare(exchange=exchange, type="direct", passive=True)
            channel.exchange_unbind(destination=exchange, source=EXCHANGE, routing_key=PROBE_KEY)
        except conn.channel_errors as exc:
            text = str(getattr(exc, "reply_text", "") or exc)
            if getattr(exc, "reply_code", None) == 403 and f"exchange '{EXCHANGE}'" in text:
                logger.warning(W_UNCHECKED, quote(exchange), quote(text))  # no read on the ladder exchange
                return None
            return quote(text)
        except conn.connection_errors as exc:
            logger.warning(W_UNCHECKED, quote(exchange), quote(exc))
            return None
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - closed by the broker already
                pass
        return None

    def learn(self, exchange: str, reason: str, *, ttl: Optional[float] = None) -> None:
        """Refuse ``exchange``: the broker said ``reason`` to a publish there. For ``ttl`` seconds when
        given (what no question reveals, such as an internal exchange), else as a negative answer."""
        now = self._clock()
        self._known[exchange] = [now + (self.negative_ttl if ttl is None else ttl), reason, now, ttl is None]

    def forget(self) -> None:
        """Forget every answer (after the relay's connection was lost, for instance)."""
        self._known.clear()

    def close(self) -> None:
        """Close the side connection; it reconnects if the check is used again."""
        try:
            self.connection.release()
        except Exception:  # noqa: BLE001 - nothing to close on a dead connection
            logger.debug("closing the exchange-check connection failed", exc_info=True)
