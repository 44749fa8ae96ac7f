"""The apply_async hook: an AMQP class whose producers publish ETA tasks into the ladder."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from datetime import datetime
from functools import cached_property
from typing import Any, Callable, Mapping, Optional

from celery.app.amqp import AMQP
from celery.utils.time import maybe_iso8601, maybe_make_aware
from kombu import Producer
from kombu.pools import ProducerPool

from kombu_ladder.index.writer import IndexWriter
from kombu_ladder.plan import delay_seconds
from kombu_ladder.producer import LadderProducerMixin, target_name

from .settings import LadderSettings, SettingsCache

__all__ = ["LadderAMQP", "LadderTaskProducer", "NATIVE_DELAYED_PREFIX", "ROUTE_OPTION", "scheduled_count",
           "shared_counter", "task_eta"]

logger = logging.getLogger(__name__)

#: Exchanges of Celery's own native delayed delivery (Celery 5.5+, quorum queues bound to a
#: topic exchange). A task addressed there by anything but this module's router is left to it.
NATIVE_DELAYED_PREFIX = "celery_delayed_"

#: The send option in which :class:`RouteKeeper` hands a task's route to the task sender,
#: past ``send_task``'s native delayed-delivery rewrite. Popped before anything is published.
ROUTE_OPTION = "ladder_route"

#: The routing options the native rewrite replaces (``queue`` popped, the other two overwritten).
_ROUTE_KEYS = ("queue", "exchange", "routing_key", "exchange_type")

#: Tasks handed to the ladder by this process tree, in shared memory (see :func:`shared_counter`).
_SCHEDULED: Any = None
_SCHEDULED_LOCK = threading.Lock()


def shared_counter() -> Any:
    """The count of tasks handed to the ladder, made on first use: ``install()`` makes it, before
    the prefork pool forks, so the children's publishes (retries, callbacks) are counted where
    ``inspect ladder`` runs. Nothing is made on import."""
    global _SCHEDULED
    with _SCHEDULED_LOCK:
        if _SCHEDULED is None:
            _SCHEDULED = multiprocessing.Value("q", 0)
        return _SCHEDULED


def scheduled_count() -> int:
    """Return how many ETA tasks this process (and its forked children) put into the ladder."""
    return int(shared_counter().value)


def _count_scheduled() -> None:
    counter = shared_counter()
    with counter.get_lock():
        counter.value += 1


def task_eta(value: Any, timezone: Any) -> datetime:
    """Read a task's ``eta`` header exactly as the Celery worker reads it.

    A naive ETA is made aware the worker's way (:func:`celery.utils.time.maybe_make_aware`
    with the app's timezone), so the ladder delivers at the moment the worker will run it.
    ``timezone`` may be a callable returning it, read only for a naive ETA (Celery
    itself sends aware ones for ``countdown``).

    Raises:
        ValueError: the header is not an ISO 8601 date and time.
    """
    if type(value) is str:  # what Celery writes: ``eta.isoformat()``, read by the C parser
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        # only a string that is exactly an isoformat() output: there every ISO 8601 reader
        # (the worker's dateutil.isoparse included) reads the same moment
        if parsed is not None and parsed.isoformat() == value and parsed.tzinfo is not None \
                and parsed.tzinfo.utcoffset(parsed) is not None:
            return parsed
    try:
        eta = maybe_iso8601(value)
    except (AttributeError, ValueError, TypeError) as exc:
        raise ValueError(f"task header eta is not an ISO 8601 datetime: {value!r}") from exc
    if not isinstance(eta, datetime):
        raise ValueError(f"task header eta is not an ISO 8601 datetime: {value!r}")
    if eta.tzinfo is not None and eta.tzinfo.utcoffset(eta) is not None:
        return eta
    return maybe_make_aware(eta, timezone() if callable(timezone) else timezone)


def _is_task_message(headers: Any) -> bool:
    """Celery task protocol 2: the headers carry the task name, id and eta."""
    return isinstance(headers, Mapping) and "task" in headers and "id" in headers


class LadderTaskProducer(LadderProducerMixin, Producer):
    """A :class:`kombu.Producer` that sends Celery tasks with an ETA through the ladder.

    Celery computes the ETA, the body, the headers and the target exchange and
    routing key as it always does and calls ``publish``; this producer reads the
    task's ``eta`` header and hands the message to :class:`LadderProducerMixin`,
    which parks it in the ladder and delivers it unchanged to that target. Every
    other publish (tasks without ETA, events, replies, control) is untouched.
    """

    #: The Celery app whose settings and timezone apply; set on a per-app subclass.
    app: Any = None

    #: The app's settings, cached (set with ``app`` on the per-app subclass, see LadderAMQP).
    settings: Optional[SettingsCache] = None

    #: The settings the ETA publish under way read (the producer's thread's own: producers are not shared).
    _publishing: Optional[LadderSettings] = None

    @property
    def max_delay(self) -> float:  # type: ignore[override]  # a setting here, an attribute in kombu_ladder
        """The app's ``ladder_max_delay`` (seconds), read when an ETA task is published."""
        if self._publishing is not None:
            return self._publishing.max_delay
        if self.settings is None:
            return super().max_delay
        return self.settings.get().max_delay

    #: The app's index writer, shared by its producers (set with ``app`` on the per-app subclass).
    shared_index: Optional[IndexWriter] = None

    @property
    def index(self) -> Optional[IndexWriter]:
        """The app's index writer while this producer publishes an ETA task with ``ladder_index`` true."""
        settings = self._publishing
        if settings is None or not settings.index:
            return None
        return self.shared_index

    @property
    def queue_type(self) -> str:  # type: ignore[override]  # a setting here, an attribute in kombu_ladder
        """The app's ``ladder_queue_type``, the profile declared before the first ETA task."""
        return self.settings.get(everything=True).queue_type if self.settings is not None else "classic"

    def publish(  # type: ignore[override]
        self, body: Any, routing_key: Optional[str] = None, *args: Any, **kwargs: Any,
    ) -> Any:
        """Publish as :meth:`kombu.Producer.publish`; a Celery task with an ``eta``
        header goes through the ladder when ``ladder_enabled`` is true."""
        if "countdown" not in kwargs and "eta" not in kwargs:
            eta = self._ladder_eta(kwargs)
            if eta is not None:
                kwargs["eta"] = eta
                try:
                    result = super().publish(body, routing_key, *args, **kwargs)
                finally:
                    self._publishing = None
                _count_scheduled()
                return result
        return super().publish(body, routing_key, *args, **kwargs)

    def _ladder_eta(self, kwargs: Mapping[str, Any]) -> Optional[datetime]:
        headers: Any = kwargs.get("headers")
        if not _is_task_message(headers) or not headers.get("eta") or self.settings is None:
            return None
        settings = self.settings.reading_for(headers.get("id"))  # the one check_countdown made, if any
        if not settings.enabled:
            return None
        exchange = kwargs.get("exchange")
        if _is_native(exchange if exchange is not None else self.exchange):
            return None  # Celery's native delayed delivery already addressed it
        app = self.app
        eta = task_eta(headers["eta"], lambda: app.conf.timezone)
        self._publishing = settings
        return eta


def _is_native(exchange: Any) -> bool:
    try:
        return target_name(exchange).startswith(NATIVE_DELAYED_PREFIX)
    except TypeError:
        return False


class RouteKeeper:
    """Celery's task router, remembering each task's own route in its send options.

    From Celery 5.5, ``send_task`` readdresses a task with a countdown or ETA to
    ``celery_delayed_27`` when any queue of the app is a quorum queue (and its
    exchange is not direct), after routing it and before the task sender sees it.
    The route kept under :data:`ROUTE_OPTION` lets :class:`LadderAMQP`'s sender undo
    that rewrite, so the task waits in the ladder and is delivered to its own queue.
    """

    def __init__(self, router: Any) -> None:
        self.router = router

    def __getattr__(self, name: str) -> Any:
        return getattr(self.router, name)

    def route(self, options: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        """Route as Celery does, then keep a copy of the route's destination."""
        routed = self.router.route(options, name, *args, **kwargs)
        routed[ROUTE_OPTION] = {key: routed[key] for key in _ROUTE_KEYS if key in routed}
        return routed


def undo_native_rewrite(options: dict[str, Any], route: Optional[Mapping[str, Any]]) -> bool:
    """Give a task Celery readdressed to native delayed delivery its own route back.

    Returns whether ``options`` (the task sender's keyword arguments) were changed.
    """
    if not route or not _is_native(options.get("exchange")):
        return False
    for key in _ROUTE_KEYS:
        options.pop(key, None)
    options.update(route)
    return True


class LadderAMQP(AMQP):
    """``app.amqp`` with ladder producers: set as the app's ``amqp_cls`` by :func:`~celery_ladder.install`.

    Both public ways Celery obtains a producer are covered: ``amqp.Producer``
    (``apply_async(connection=)``, beat) and ``amqp.producer_pool``
    (``apply_async()``, retries, canvas). A producer passed explicitly with
    ``apply_async(producer=...)`` is wrapped when its task has an ETA.
    """

    _producer_pool: Optional[ProducerPool]  #: set to None by AMQP.__init__ (untyped in Celery)

    @cached_property
    def Producer(self) -> type:  # type: ignore[override]  # noqa: N802 - Celery's attribute name
        """This app's producer class."""
        app = self.app
        cache = SettingsCache(lambda: app.conf)
        return type("LadderTaskProducer", (LadderTaskProducer,),
                    {"app": app, "settings": cache, "shared_index": IndexWriter()})

    @property
    def producer_pool(self) -> ProducerPool:
        """The app's producer pool, handing out :attr:`Producer` instances."""
        if self._producer_pool is None:
            connections = self.app.pool
            self._producer_pool = ProducerPool(connections, limit=connections.limit, Producer=self.Producer)
        return self._producer_pool

    publisher_pool = producer_pool  # Celery's compat alias

    def as_task_v2(self, task_id: Any, name: Any, args: Any = None, kwargs: Any = None, countdown: Any = None,
                   *rest: Any, **options: Any) -> Any:
        """Celery's task message, after :meth:`check_countdown`."""
        self.check_countdown(countdown, task_id=task_id)
        return super().as_task_v2(task_id, name, args, kwargs, countdown, *rest, **options)

    def as_task_v1(self, task_id: Any, name: Any, args: Any = None, kwargs: Any = None, countdown: Any = None,
                   *rest: Any, **options: Any) -> Any:
        """Celery's task message (protocol 1), after :meth:`check_countdown`."""
        self.check_countdown(countdown, task_id=task_id)
        return super().as_task_v1(task_id, name, args, kwargs, countdown, *rest, **options)

    def check_countdown(self, countdown: Any, *, task_id: Any = None) -> None:
        """Refuse a numeric ``countdown`` longer than ``ladder_max_delay`` before Celery turns it into an
        ETA (``countdown=10**12`` overflows a datetime deep inside Celery) and before anything is sent.

        Raises:
            ValueError: naming ``countdown`` and the maximum delay.
        """
        if isinstance(countdown, (int, float)) and not isinstance(countdown, bool) and countdown > 0:
            settings = self.Producer.settings.read_for(task_id)  # type: ignore[attr-defined]  # a per-app subclass
            if settings.enabled:
                delay_seconds(countdown, argument="countdown", max_delay=settings.max_delay)

    def Router(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - Celery's method name
        """Celery's router, wrapped in a :class:`RouteKeeper`."""
        return RouteKeeper(super().Router(*args, **kwargs))

    def _create_task_sender(self) -> Callable[..., Any]:
        send = super()._create_task_sender()
        ladder_producer = self.Producer
        settings: SettingsCache = ladder_producer.settings  # type: ignore[attr-defined]  # a per-app subclass

        def send_task_message(producer: Any, name: str, message: Any, **kwargs: Any) -> Any:
            route = kwargs.pop(ROUTE_OPTION, None)
            eta = message.headers.get("eta")
            # the setting is read only for a task Celery readdressed to native delayed delivery
            if eta and route and _is_native(kwargs.get("exchange")) and settings.get().enabled \
                    and undo_native_rewrite(kwargs, route):
                logger.debug("task %s: the ladder delays it instead of native delayed delivery", name)
            if not isinstance(producer, LadderProducerMixin) and eta:
                producer = ladder_producer(
                    producer.channel, exchange=producer.exchange, routing_key=producer.routing_key,
                    serializer=producer.serializer, compression=producer.compression, auto_declare=False,
                )
            return send(producer, name, message, **kwargs)

        return send_task_message
