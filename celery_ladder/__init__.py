"""celery_ladder: Celery's countdown/eta through the AceMQ ladder, with the relay in the workers."""

from __future__ import annotations

import logging
from importlib.util import find_spec
from typing import Any

from kombu_ladder.errors import missing_extra

if find_spec("celery") is None:  # a kombu-only install: say what to install, in one line
    raise ModuleNotFoundError(missing_extra("celery_ladder", "celery", "celery", 'celery>=5.3,<6'), name="celery")

from celery.utils.imports import symbol_by_name  # noqa: E402 - after the check above

from .publish import LadderAMQP, shared_counter
from .settings import LadderSettings

__all__ = ["install", "installed", "LadderSettings"]

logger = logging.getLogger(__name__)


def installed(app: Any) -> bool:
    """Return whether :func:`install` was applied to ``app``."""
    cls = _amqp_class(app)
    return isinstance(cls, type) and issubclass(cls, LadderAMQP)


def _amqp_class(app: Any) -> Any:
    cls = app.amqp_cls
    return symbol_by_name(cls) if isinstance(cls, str) else cls


def add_relay_step(app: Any) -> None:
    """Add the relay and adoption bootsteps to ``app``'s worker consumer (idempotent).

    They run in workers started after this call, unless ``ladder_relay`` (and
    ``ladder_adopt``) say otherwise.
    """
    from . import control  # noqa: F401 - registers ``celery inspect ladder`` in this process
    from .adoption.step import LadderAdopt
    from .bootstep import LadderRelay

    app.steps["consumer"].add(LadderRelay)
    app.steps["consumer"].add(LadderAdopt)


def _check_settings(sender: Any = None, source: Any = None, **kwargs: Any) -> None:
    LadderSettings.from_conf(source)


def _install_revoke(app: Any) -> None:
    """Make ``app``'s revokes record a ladder cancellation too (see :mod:`celery_ladder.revoke`)."""
    from .revoke import LadderControl

    base = app.control_cls
    base = symbol_by_name(base) if isinstance(base, str) else base
    if isinstance(base, type) and issubclass(base, LadderControl):
        return
    app.control_cls = type(f"Ladder{base.__name__}", (LadderControl, base), {})
    if "control" in app.__dict__:  # already built: rebuild it with the revoke hook
        del app.control


def install(app: Any) -> Any:
    """Send ``app``'s countdown/eta tasks through the ladder and run the relay in its workers.

    After this, ``apply_async(countdown=|eta=)``, ``retry(countdown=)``,
    ``autoretry_for`` backoffs and signatures with a countdown are published
    into the ladder and delivered to the exchange and routing key Celery chose,
    unchanged. Tasks without an ETA take Celery's own path. A revoke also
    records a durable ladder cancellation of the task id. The settings
    ``ladder_enabled`` and ``ladder_relay`` are read when they are used, so
    call this before or after configuring the app. Idempotent.

    Arguments:
        app: the :class:`celery.Celery` application.

    Returns:
        ``app``, so it can be used as ``app = install(Celery(...))``.

    The ``ladder_*`` settings are validated here when ``app`` is configured
    already, else as soon as its configuration is loaded (a bad one is then
    logged as an error by Celery's signal, and raised again where it is read).

    Raises:
        TypeError: ``app`` is not a Celery application, or a ``ladder_*`` setting has the wrong type.
        ValueError: a ``ladder_*`` setting has a bad value (the error names it).
    """
    if not hasattr(app, "amqp_cls") or not hasattr(app, "steps"):
        raise TypeError(f"app must be a celery.Celery application, not {type(app).__name__}")
    if app.configured:
        LadderSettings.from_conf(app.conf)
    else:
        app.on_after_configure.connect(_check_settings, weak=False, dispatch_uid="celery_ladder.settings")
    shared_counter()  # made here, before a prefork pool forks (see celery_ladder.publish)
    if not installed(app):
        base = _amqp_class(app)
        app.amqp_cls = LadderAMQP if base is LadderAMQP.__mro__[1] else type(
            f"Ladder{base.__name__}", (LadderAMQP, base), {},
        )
        if "amqp" in app.__dict__:  # already built: rebuild it with the ladder's producers
            del app.amqp
        logger.debug("celery_ladder installed on %r", app)
    _install_revoke(app)
    add_relay_step(app)
    return app
