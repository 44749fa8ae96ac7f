"""Settings: validation table, install(), and the ladder_enabled / ladder_relay toggles on a worker."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery
from conftest import wait_for

import celery_ladder
from celery_ladder import LadderAMQP, LadderSettings
from celery_ladder.bootstep import LadderRelay
from celery_ladder.publish import scheduled_count
from kombu_ladder.contract import CONTROL, rung_names

from .helpers import queue_depth, relay_of


@pytest.mark.parametrize("given,expected", [
    ({}, LadderSettings(enabled=True, relay=True)),
    ({"ladder_enabled": None}, LadderSettings(enabled=True, relay=True)),
    ({"ladder_enabled": False}, LadderSettings(enabled=False, relay=True)),
    ({"ladder_relay": False}, LadderSettings(enabled=True, relay=False)),
    ({"ladder_enabled": "false", "ladder_relay": "Yes"}, LadderSettings(enabled=False, relay=True)),
    ({"ladder_enabled": 0, "ladder_relay": 1}, LadderSettings(enabled=False, relay=True)),
    ({"ladder_enabled": " ON "}, LadderSettings(enabled=True, relay=True)),
])
def test_settings_from_conf(given: dict[str, Any], expected: LadderSettings) -> None:
    assert LadderSettings.from_conf(given) == expected


@pytest.mark.parametrize("name,value", [
    ("ladder_enabled", "maybe"), ("ladder_enabled", 2), ("ladder_relay", 1.0), ("ladder_relay", []),
])
def test_a_bad_setting_is_a_value_error_naming_it_and_its_django_name(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"{name} \(CELERY_{name.upper()} in Django settings\)"):
        LadderSettings.from_conf({name: value})


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        LadderSettings().enabled = False  # type: ignore[misc]


def test_install_swaps_the_amqp_class_once_and_adds_the_relay_step() -> None:
    app = Celery("x", broker="memory://", set_as_current=False)
    vanilla = app.amqp
    assert celery_ladder.install(app) is app
    assert isinstance(app.amqp, LadderAMQP) and app.amqp is not vanilla
    assert issubclass(app.amqp.Producer, celery_ladder.LadderTaskProducer)
    assert app.amqp.Producer.app is app
    celery_ladder.install(app)
    assert app.amqp_cls is LadderAMQP and LadderRelay in app.steps["consumer"]
    with pytest.raises(TypeError, match="celery.Celery"):
        celery_ladder.install(object())


def test_install_keeps_a_custom_amqp_class() -> None:
    from celery.app.amqp import AMQP

    class Custom(AMQP):
        marker = True

    app = Celery("x", broker="memory://", set_as_current=False, amqp=Custom)
    celery_ladder.install(app)
    assert isinstance(app.amqp, LadderAMQP) and isinstance(app.amqp, Custom)


def test_a_bad_setting_fails_the_publish(celery_app: Any) -> None:
    celery_app.conf.ladder_enabled = "sometimes"
    with pytest.raises(ValueError, match="ladder_enabled"):
        celery_app.tasks["t.stamp"].apply_async(("x",), countdown=5)


class TestDisabled:
    """ladder_enabled=False: Celery's own path, and the worker holds the task in memory."""

    @pytest.fixture
    def celery_overrides(self) -> dict[str, Any]:
        return {"ladder_enabled": False}

    @pytest.mark.broker
    @pytest.mark.celery
    def test_vanilla_behaviour_is_restored(self, celery_app: Any, celery_worker: Any, connection: Any) -> None:
        before = scheduled_count()
        result = celery_app.tasks["t.stamp"].apply_async(("vanilla",), countdown=4)
        assert scheduled_count() == before
        assert all(not queue_depth(connection, name) for name in rung_names())

        def held() -> bool:
            replies = celery_app.control.inspect(destination=[celery_worker.hostname], timeout=2, limit=1)
            scheduled = (replies.scheduled() or {}).get(celery_worker.hostname, [])
            return any(entry["request"]["id"] == result.id for entry in scheduled)

        wait_for(held, timeout=5, message="the worker to hold the ETA task in memory (vanilla Celery)")
        wait_for(lambda: celery_app.recorder.of("vanilla"), timeout=15, message="the vanilla task")
        run = celery_app.recorder.of("vanilla")[0]
        assert run.at >= time.time() - 15 and run.eta is not None
        assert relay_of(celery_worker) is not None, "ladder_enabled does not switch the relay off"


class TestRelayOff:
    """ladder_relay=False: the worker runs no relay bootstep."""

    @pytest.fixture
    def celery_overrides(self) -> dict[str, Any]:
        return {"ladder_relay": False}

    @pytest.mark.broker
    @pytest.mark.celery
    def test_no_relay_in_the_worker(self, celery_app: Any, celery_worker: Any, connection: Any) -> None:
        assert relay_of(celery_worker) is None
        assert not any(isinstance(step, LadderRelay) for step in celery_worker.consumer.steps)
        channel = connection.channel()
        try:
            consumers = channel.queue_declare(CONTROL, passive=True).consumer_count
        except connection.channel_errors:
            consumers = 0  # not even declared: nobody relays
        assert consumers == 0
        replies = celery_app.control.broadcast("ladder", reply=True, timeout=2, limit=1,
                                               destination=[celery_worker.hostname])
        assert replies[0][celery_worker.hostname]["relay"] is False
