"""LadderProducerMixin: ``publish(..., countdown=, eta=)`` into the ladder."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
import weakref
from datetime import datetime
from typing import Any, Callable, Optional

from amqp.basic_message import Message as AmqpMessage
from kombu import Exchange, Producer

from .carry import waiting_for_confirms
from .compat import PUBLISH_OPTIONS, RETRIED_DECLARES, current_batch
from .contract import EXCHANGE, MESSAGE_TYPE, RUNGS, rung_name
from .controlplane import ENTRY
from .envelope import scheduled_content_header, scheduled_headers
from .index.records import STREAM as INDEX_STREAM
from .index.records import entry as index_entry
from .index.writer import IndexWriter, open_index
from .link import RawMessage, clock_of, sends_encoded
from .plan import MAX_DELAY, Delay, check_max_delay, due_at_ms, place
from .targets import is_internal, name_problem, own_name_problem
from .text import quote
from .topology import check_queue_type, declare_or_find

__all__ = ["LadderProducerMixin", "LadderProducer", "check_publish_keywords", "target_name"]

logger = logging.getLogger(__name__)

_PUBLISH = inspect.signature(Producer.publish)

#: Queue name per rung, computed once (a delayed publish names its rung on every call).
_RUNG_NAMES: dict[int, str] = {rung: rung_name(rung) for rung in RUNGS}


#: Underlying connections the ladder topology has been declared on.
_declared: "weakref.WeakSet[Any]" = weakref.WeakSet()
_declared_lock = threading.Lock()


def target_name(exchange: Any) -> str:
    """Return an exchange's name, whether given as an Exchange, a string or None."""
    if exchange is None:
        return ""
    if isinstance(exchange, Exchange):
        return exchange.name or ""
    if isinstance(exchange, str):
        return exchange
    raise TypeError(f"exchange must be a str or kombu.Exchange, not {type(exchange).__name__}")


#: kombu's named ``publish`` parameters and their defaults (the rest are AMQP properties).
_NAMED: dict[str, Any] = {
    name: param.default for name, param in _PUBLISH.parameters.items()
    if param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and name != "self"
}


def _publish_arguments(producer: Any, body: Any, routing_key: Optional[str], args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a ``publish`` call into kombu's named arguments (defaults filled) and AMQP properties."""
    if args:  # rare: positional arguments past routing_key; let inspect sort them out
        bound = _PUBLISH.bind(producer, body, routing_key, *args, **kwargs)
        bound.apply_defaults()
        params = dict(bound.arguments)
        params.pop("self")
        return params, params.pop("properties")
    params = dict(_NAMED)
    properties = {}
    for name, value in kwargs.items():
        if name in params:
            params[name] = value
        else:
            properties[name] = value
    params["body"] = body
    params["routing_key"] = routing_key
    return params, properties


#: The AMQP basic properties a keyword of ``publish`` may set (kombu passes any other keyword on, and
#: py-amqp then drops it without a word: ``key="k"`` or ``contdown=5`` would vanish).
AMQP_PROPERTIES: frozenset[str] = frozenset(name for name, _ in AmqpMessage.PROPERTIES) - {"application_headers"}


def check_publish_keywords(kwargs: dict[str, Any], *, own: tuple[str, ...] = ("countdown", "eta")) -> None:
    """Refuse a keyword neither :meth:`kombu.Producer.publish` nor the ladder takes, as Python refuses one.

    Raises:
        TypeError: naming the first such keyword.
    """
    for name in kwargs:
        if name not in _NAMED and name not in AMQP_PROPERTIES and name not in own:
            raise TypeError(
                f"publish() got an unexpected keyword argument {name!r}: it is neither one of kombu's Producer.publish "
                f"arguments, nor an AMQP property ({', '.join(sorted(AMQP_PROPERTIES))}), nor the ladder's "
                f"({', '.join(own)})"
            )


# Targets found deliverable are remembered, so names are checked once, not on every publish; a refused one
# raises, which lru_cache does not remember. Bounded: a producer that makes up routing keys does not grow it.
@functools.lru_cache(maxsize=4096)
def _check_target(exchange: str, routing_key: str) -> None:
    """Refuse a target the relay would park when due."""
    for argument, what, name in (("exchange", "exchange", exchange), ("routing_key", "routing key", routing_key)):
        problem = name_problem(what, name)
        if problem is None and what == "exchange" and is_internal(name):
            problem = "exchange is internal to RabbitMQ, which refuses every publish to it"
        if problem is not None:  # the relay would park it when due: refuse it now
            raise ValueError(f"{argument} {quote(name, limit=60)} cannot be delivered to: the {problem}")
    own = own_name_problem(exchange, routing_key)
    if own is not None:  # the relay parks it as refused when due: refuse it now
        raise ValueError(f"{own[0]}: the target {own[1]}")


def _encoded_rung_message(body: Any, headers: dict[str, Any], properties: dict[str, Any], *, exchange: str,
                          routing_key: str, due: int, content_type: Optional[str],
                          content_encoding: Optional[str], mode: Optional[int],
                          priority: Any) -> Optional[RawMessage]:
    """The rung message with its properties encoded here, or None when py-amqp must encode them."""
    if type(body) is str:  # kombu's json serializer gives text; py-amqp would encode it so
        content_encoding = content_encoding or "utf-8"
        try:
            body = body.encode(content_encoding)
        except (LookupError, UnicodeError):
            return None  # py-amqp raises it
    elif type(body) is not bytes:
        return None
    raw = scheduled_content_header(headers, properties, exchange=exchange, routing_key=routing_key, due_at=due,
                                   content_type=content_type, content_encoding=content_encoding,
                                   delivery_mode=mode, priority=priority)
    return None if raw is None else RawMessage(body, raw)


class LadderProducerMixin:
    """Mixin for :class:`kombu.Producer`: a publish with ``countdown`` or ``eta``
    waits in the ladder and is delivered to its exchange and routing key later.

    A publish without either is passed to :meth:`kombu.Producer.publish`
    unchanged. Give the mixin before ``Producer`` in the bases.
    """

    #: Where "now" comes from, in epoch seconds; injectable for tests and simulators.
    clock: Callable[[], float] = staticmethod(time.time)

    #: The longest ``countdown``/``eta`` accepted, in seconds: a guard against unit mistakes.
    max_delay: float = MAX_DELAY

    #: The queue profile declared before the first delayed publish: "classic" (the contract) or "quorum".
    queue_type: str = "classic"

    #: The index writer this producer made (see :attr:`index`); None: none yet.
    _index_writer: Optional[IndexWriter] = None

    @property
    def index(self) -> Optional[IndexWriter]:
        """Where what this producer puts into a rung is indexed (``ladder.index``); None: not indexed.

        Set by ``index=True`` (:class:`LadderProducer`); Celery's producer makes one when
        ``ladder_index`` is true.
        """
        return self._index_writer

    def _send_index_record(self, record: bytes) -> Any:
        """Publish one index record through the entry exchange and wait for the broker's confirm, on a confirming
        channel of this producer's own (its own channel, where no :class:`kombu.Connection` is at hand)."""
        channel = self.__dict__.get("_index_channel")
        if channel is None:
            own: Any = self.channel  # type: ignore[attr-defined]
            client: Any = getattr(getattr(own, "connection", None), "client", None)
            channel = waiting_for_confirms(client.channel() if hasattr(client, "default_channel") else own)
            self.__dict__["_index_channel"] = channel
        message = channel.prepare_message(record, content_type="application/json", content_encoding="utf-8",
                                          properties={"delivery_mode": 2})
        return channel.basic_publish(message, exchange=ENTRY.exchange, routing_key=INDEX_STREAM, mandatory=True)

    def _declare_index(self) -> None:
        """Declare ``ladder.index`` and check this user may write it, on a channel of its own, when the
        :class:`kombu.Connection` is at hand (:func:`~kombu_ladder.index.writer.open_index`: raises
        :class:`~kombu_ladder.index.writer.IndexRefused`, and the writer then sends nothing)."""
        client = getattr(getattr(self.channel, "connection", None), "client", None)  # type: ignore[attr-defined]
        if not hasattr(client, "default_channel"):
            return
        open_index(client, at=int(self.clock() * 1000))

    def publish(  # type: ignore[override]
        self,
        body: Any,
        routing_key: Optional[str] = None,
        *args: Any,
        countdown: Optional[Delay] = None,
        eta: Optional[datetime] = None,
        **kwargs: Any,
    ) -> Any:
        """Publish ``body``; with ``countdown`` (seconds or timedelta) or ``eta``
        (an aware datetime) it is delivered that much later.

        Every other argument is :meth:`kombu.Producer.publish`'s.

        Raises:
            TypeError: ``countdown`` or ``eta`` has the wrong type.
            ValueError: ``countdown`` is NaN, infinite or longer than :attr:`max_delay`,
                ``eta`` is naive or further ahead than :attr:`max_delay`, or the default
                exchange is targeted without a routing key.
        """
        if countdown is None and eta is None:
            return super().publish(body, routing_key, *args, **kwargs)  # type: ignore[misc]
        params, properties = _publish_arguments(self, body, routing_key, args, kwargs)
        now = self.clock()  # one reading: countdown=3600 waits in the 1 h rung, not a ms short of it
        due = due_at_ms(now, countdown=countdown, eta=eta, max_delay=self.max_delay)
        return self._publish_delayed(due, params, properties, now_ms=int(now * 1000))

    def _publish_delayed(self, due: int, params: dict[str, Any], properties: dict[str, Any],
                         *, now_ms: Optional[int] = None) -> Any:
        exchange = target_name(params["exchange"] if params["exchange"] is not None else self.exchange)  # type: ignore[attr-defined]
        routing_key = params["routing_key"]
        if routing_key is None:
            routing_key = self.routing_key  # type: ignore[attr-defined]
        if not isinstance(routing_key, str):
            raise TypeError(f"routing_key must be a str, not {type(routing_key).__name__}")
        if not exchange and not routing_key:
            raise ValueError("routing_key is required when publishing to the default exchange ('')")
        _check_target(exchange, routing_key)

        headers = dict(params["headers"] or {})
        compression = params["compression"]
        body, content_type, content_encoding = self._prepare(  # type: ignore[attr-defined]
            params["body"], params["serializer"], params["content_type"], params["content_encoding"],
            self.compression if compression is None else compression, headers,  # type: ignore[attr-defined]
        )
        common = {name: params[name] for name in PUBLISH_OPTIONS}
        common["content_type"] = content_type
        common["content_encoding"] = content_encoding
        common["compression"] = ""  # compressed above, once: kombu would apply the producer's default again
        rung = place(due, int(self.clock() * 1000) if now_ms is None else now_ms)
        if rung is None:
            return super().publish(  # type: ignore[misc]
                body, routing_key, exchange=exchange, headers=headers,
                delivery_mode=params["delivery_mode"], expiration=params["expiration"],
                **common, **properties,
            )
        if params["expiration"] is not None:
            logger.debug("expiration=%r is not carried into a rung (%s)", params["expiration"], exchange)
        _, mode = self._delivery_details(exchange, params["delivery_mode"])  # type: ignore[attr-defined]
        self.declare_ladder()
        if "type" in properties or "expiration" in properties:
            properties = {k: v for k, v in properties.items() if k not in ("type", "expiration")}
        queue = _RUNG_NAMES[rung]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("scheduling for %d into %s -> %r/%r", due, queue, exchange, routing_key)
        if sends_encoded(self.channel):  # type: ignore[attr-defined]
            encoded = _encoded_rung_message(body, headers, properties, exchange=exchange, routing_key=routing_key,
                                            due=due, content_type=content_type,
                                            content_encoding=content_encoding, mode=mode,
                                            priority=common["priority"])
            if encoded is not None:
                self._index(body, headers, properties, exchange, routing_key, due, now_ms)  # entry first
                return self._publish_encoded(encoded, queue, params)
        self._index(body, headers, properties, exchange, routing_key, due, now_ms)  # entry first, confirmed
        return super().publish(  # type: ignore[misc]
            body, queue, exchange=EXCHANGE,
            headers=scheduled_headers(
                headers, exchange=exchange, routing_key=routing_key, due_at=due,
                content_type=content_type, delivery_mode=mode,
            ),
            delivery_mode=2, type=MESSAGE_TYPE, **common, **properties,
        )

    def _index(self, body: Any, headers: dict[str, Any], properties: dict[str, Any], exchange: str,
               routing_key: str, due: int, now_ms: Optional[int]) -> None:
        """Write the entry of what is about to be put into a rung, confirmed, when there is an index writer.

        Before the message: a crash between the two leaves an entry without its message (a sync
        reconciles it: not found waiting), never a message without its entry. Raises what the
        write raised (the message is then not published), except a refusal of the indexer's rights,
        after which this producer schedules unindexed (see :meth:`IndexWriter.write`).
        """
        writer = self.index
        if writer is None:
            return
        task = headers.get("task") if "id" in headers else None
        writer.write(index_entry(
            message_id=properties.get("message_id"), task=task,
            task_id=(properties.get("correlation_id") or headers.get("id")) if task is not None else None,
            exchange=exchange, routing_key=routing_key, due=due,
            at=int(self.clock() * 1000) if now_ms is None else now_ms,
            size=len(body) if isinstance(body, (bytes, str)) else 0), self._send_index_record, self._declare_index)

    def _publish_encoded(self, message: RawMessage, queue: str, params: dict[str, Any]) -> Any:
        """Send a rung message whose properties are already encoded, as ``Producer.publish`` sends one.

        What kombu does around the channel call is done here too: the producer's
        exchange and ``declare`` declared (with the retry policy from kombu 5.5),
        the publish retried through ``Connection.ensure`` when ``retry`` is true,
        a :meth:`kombu.Producer.batch` in progress honoured (kombu 5.7), and
        ``timeout``/``confirm_timeout`` passed to the channel.
        """
        declare = list(params["declare"] or ())
        if self.auto_declare and self.exchange.name and self.exchange not in declare:  # type: ignore[attr-defined]
            declare.append(self.exchange)  # type: ignore[attr-defined]
        retry, retry_policy = params["retry"], params["retry_policy"] or {}
        send_options = {"exchange": EXCHANGE, "routing_key": queue, "mandatory": params["mandatory"],
                        "immediate": params["immediate"], "timeout": params["timeout"]}
        if params.get("confirm_timeout") is not None:
            send_options["confirm_timeout"] = params["confirm_timeout"]

        def send() -> Any:
            channel = self.channel  # type: ignore[attr-defined]
            for entity in declare:
                if RETRIED_DECLARES:
                    self.maybe_declare(entity, retry=retry, **retry_policy)  # type: ignore[attr-defined]
                else:
                    self.maybe_declare(entity)  # type: ignore[attr-defined]
            batch = current_batch(self)
            if batch is not None:
                return batch.publish(channel, message, **send_options)
            return channel.basic_publish(message, **send_options)

        if retry:
            connection = self.connection  # type: ignore[attr-defined]
            if RETRIED_DECLARES:
                connection.transport_options.update(retry_policy)
            send = connection.ensure(self, send, **retry_policy)
        return send()

    def declare_ladder(self) -> None:
        """Declare the ladder topology once per underlying broker connection (or, for a user who may not
        declare it, find it declared: see :func:`~kombu_ladder.topology.declare_or_find`)."""
        channel = self.channel  # type: ignore[attr-defined]
        key = getattr(channel, "connection", None)
        if key is not None and self.__dict__.get("_ladder_declared_on") is key:
            return  # this producer saw it declared on this very connection (the common case, without the lock)
        with _declared_lock:
            if key is not None and key in _declared:
                self.__dict__["_ladder_declared_on"] = key
                return
        # Declare on a channel of its own when the kombu Connection is at hand,
        # so a conflict does not kill the channel this producer publishes on.
        client = getattr(key, "client", None)
        declare_or_find(client if hasattr(client, "default_channel") else channel, queue_type=self.queue_type)
        if key is not None:
            with _declared_lock:
                _declared.add(key)
            self.__dict__["_ladder_declared_on"] = key


class LadderProducer(LadderProducerMixin, Producer):
    """A :class:`kombu.Producer` whose ``publish`` accepts ``countdown=`` and ``eta=``.

    ``clock`` replaces :attr:`~LadderProducerMixin.clock`; ``max_delay`` (seconds,
    default :data:`~kombu_ladder.plan.MAX_DELAY`, ten years) replaces
    :attr:`~LadderProducerMixin.max_delay`. With ``index=True`` what it puts into a
    rung is indexed in ``ladder.index`` (see :doc:`/waiting`): each entry is written,
    and confirmed by the broker, before its message is published, so when ``publish``
    returns its entry is in the broker, or ``publish`` raised.
    """

    def __init__(self, *args: Any, clock: Optional[Callable[[], float]] = None,
                 max_delay: Optional[float] = None, queue_type: str = "classic", index: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if index:
            self._index_writer = IndexWriter()
        clock = clock_of(self.connection, clock, default=None)  # the simulator's on a ladder-sim connection
        self.queue_type = check_queue_type(queue_type)
        if clock is not None:
            self.clock = clock
        if max_delay is not None:
            self.max_delay = check_max_delay(max_delay)

    def publish(self, body: Any, routing_key: Optional[str] = None, *args: Any, **kwargs: Any) -> Any:
        """:meth:`LadderProducerMixin.publish`, refusing a keyword neither kombu's ``publish`` nor the
        ladder takes (:func:`check_publish_keywords`): ``contdown=5`` would otherwise publish at once."""
        check_publish_keywords(kwargs)
        return super().publish(body, routing_key, *args, **kwargs)
