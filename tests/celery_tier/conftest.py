"""Celery-tier fixtures: an installed app on the session vhost, and celery.contrib.pytest's embedded worker."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from celery.contrib.pytest import (  # noqa: F401 - fixtures used by name
    celery_includes,
    celery_worker,
    celery_worker_parameters,
    celery_worker_pool,
)
from celery.contrib.testing.app import TestApp, setup_default_app
from kombu import Connection
from kombu.asynchronous import set_event_loop

import celery_ladder

from .recording import Recorder, purge_queues, register_tasks


@pytest.fixture
def celery_overrides() -> dict[str, Any]:
    """Per-module extra Celery configuration (override in a test module)."""
    return {}


@pytest.fixture
def ladder_mode() -> str:
    """``"ladder"``: ``celery_app`` has the ladder installed; a module contrasting vanilla Celery
    parametrizes it with ``"vanilla"`` too."""
    return "ladder"


@pytest.fixture
def celery_app(broker_url: str, connection: Connection, celery_overrides: dict[str, Any],
               ladder_mode: str) -> Iterator[Any]:
    """A Celery app on the session vhost with the ladder installed (unless ``ladder_mode`` is
    ``"vanilla"``); replaces celery.contrib.pytest's."""
    purge_queues(broker_url)
    # Celery 5.3 and 5.4: an embedded worker reuses kombu's process-wide event loop, and with it
    # the timer of the first worker the process started, which stops with that worker; a later
    # test's worker then never fires its ETA timers. A fresh loop per test's worker avoids it
    # (Celery 5.5+ keeps the hub's timers working across workers).
    set_event_loop(None)
    config = {"broker_url": broker_url, "broker_connection_retry_on_startup": True, **celery_overrides}
    app = TestApp(set_as_current=False, config=config)
    if ladder_mode == "ladder":
        celery_ladder.install(app)
    app.recorder = Recorder()
    register_tasks(app)
    with setup_default_app(app):
        yield app
    app.close()

