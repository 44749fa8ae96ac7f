"""LadderConfig: installs the ladder on the project's Celery app when Django starts."""

from __future__ import annotations

import logging

from django.apps import AppConfig

__all__ = ["LadderConfig"]

logger = logging.getLogger(__name__)

W_DEFAULT_APP = (
    "celery_ladder.django: no Celery app is current when Django starts; import your app in "
    "your project package's __init__.py (from .celery import app as celery_app), as Celery's "
    "Django guide does, or call celery_ladder.install(app) yourself"
)


class LadderConfig(AppConfig):
    """Installs :func:`celery_ladder.install` on the current Celery app.

    In the layout of Celery's Django guide the project package imports its
    Celery app, so it is the current app by the time Django calls
    :meth:`ready`. The settings are then read through the app's configuration:
    with ``config_from_object('django.conf:settings', namespace='CELERY')`` they
    are ``CELERY_LADDER_ENABLED`` and ``CELERY_LADDER_RELAY``, and a bad value
    stops Django's start with a :class:`ValueError` naming the setting.
    """

    name = "celery_ladder.django"
    label = "celery_ladder"
    verbose_name = "Celery ladder"
    default = True

    def ready(self) -> None:
        from celery import _state, current_app

        from .. import install
        from ..settings import LadderSettings

        # Not "is _state.default_app": Celery's Django fixup makes the project's app the
        # default one. Only Celery's own fallback app is never set as current.
        if getattr(_state._tls, "current_app", None) is None:
            logger.warning(W_DEFAULT_APP)
            return
        app = current_app._get_current_object()
        install(app)
        LadderSettings.from_conf(app.conf)
