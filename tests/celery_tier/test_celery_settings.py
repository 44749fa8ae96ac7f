"""Settings: validation table, install(), and the ladder_enabled / ladder_relay toggles on a worker."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from helpers import queue_depth, wait_for, wait_for_counters

import celery_ladder
from celery_ladder import LadderSettings
from celery_ladder.bootstep import LadderRelay
from celery_ladder.publish import LadderAMQP, LadderTaskProducer, scheduled_count
from kombu_ladder.contract import CONTROL, rung_names
from kombu_ladder.plan import MAX_DELAY

from .recording import relay_of


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


@pytest.mark.parametrize("given,expected", [
    (None, float(MAX_DELAY)), (86400, 86400.0), ("3600", 3600.0), (" 90.5 ", 90.5),
    (timedelta(days=4000), 4000 * 86400.0),
])
def test_ladder_max_delay_defaults_to_ten_years_and_reads_seconds(given: Any, expected: float) -> None:
    assert LadderSettings.from_conf({"ladder_max_delay": given}).max_delay == expected
    assert LadderSettings().max_delay == MAX_DELAY == 3653 * 86400


@pytest.mark.parametrize("value,error", [
    (0, ValueError), (-1, ValueError), ("ten years", ValueError), ("nan", ValueError), (True, TypeError),
    ([1], TypeError),
])
def test_a_bad_ladder_max_delay_names_the_setting_and_its_django_name(value: Any, error: type) -> None:
    with pytest.raises(error, match=r"ladder_max_delay \(CELERY_LADDER_MAX_DELAY in Django settings\)"):
        LadderSettings.from_conf({"ladder_max_delay": value})


def test_ladder_max_delay_bounds_a_publish_and_a_two_year_eta_is_accepted_by_default() -> None:
    app = celery_ladder.install(Celery("x", broker="memory://", set_as_current=False))
    app.conf.ladder_max_delay = 60
    producer = app.amqp.Producer(app.connection_for_write().default_channel)
    eta = (datetime.now(timezone.utc) + timedelta(seconds=120)).isoformat()
    headers = {"task": "t", "id": "1", "eta": eta}
    with pytest.raises(ValueError, match="maximum delay of 60s .*ladder_max_delay"):
        producer.publish(b"{}", routing_key="q", headers=headers)
    app.conf.ladder_max_delay = None
    assert producer.max_delay == MAX_DELAY


def test_install_swaps_the_amqp_class_once_and_adds_the_relay_step() -> None:
    app = Celery("x", broker="memory://", set_as_current=False)
    vanilla = app.amqp
    assert celery_ladder.install(app) is app
    assert isinstance(app.amqp, LadderAMQP) and app.amqp is not vanilla
    assert issubclass(app.amqp.Producer, LadderTaskProducer)
    assert app.amqp.Producer.app is app
    celery_ladder.install(app)
    assert app.amqp_cls is LadderAMQP and LadderRelay in app.steps["consumer"]
    with pytest.raises(TypeError, match="celery.Celery"):
        celery_ladder.install(object())


def test_install_validates_the_settings_of_a_configured_app() -> None:
    app = Celery("x", broker="memory://", set_as_current=False)
    app.conf.ladder_max_delay = "ten years"
    assert app.conf.broker_url and app.configured  # reading a setting loads the configuration
    with pytest.raises(ValueError, match=r"ladder_max_delay \(CELERY_LADDER_MAX_DELAY"):
        celery_ladder.install(app)
    app.conf.ladder_max_delay = 60
    assert celery_ladder.install(app) is app


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

    #: Seconds until the vanilla task is due; the worker must be seen holding it before then.
    COUNTDOWN = 10

    @pytest.fixture
    def celery_overrides(self) -> dict[str, Any]:
        return {"ladder_enabled": False}

    @pytest.mark.broker
    @pytest.mark.celery
    def test_vanilla_behaviour_is_restored(self, celery_app: Any, celery_worker: Any, connection: Any) -> None:
        before = scheduled_count()
        # The window to see it held: long enough for a few inspect round trips (each waits up to 2 s for
        # a reply a busy worker may not send in time), so a slow first reply does not outlast the countdown.
        result = celery_app.tasks["t.stamp"].apply_async(("vanilla",), countdown=self.COUNTDOWN)
        assert scheduled_count() == before
        assert all(not queue_depth(connection, name, if_missing=0) for name in rung_names())

        def held() -> bool:
            replies = celery_app.control.inspect(destination=[celery_worker.hostname], timeout=2, limit=1)
            scheduled = (replies.scheduled() or {}).get(celery_worker.hostname, [])
            return any(entry["request"]["id"] == result.id for entry in scheduled)

        wait_for(held, timeout=self.COUNTDOWN - 1, message="the worker to hold the ETA task in memory (vanilla Celery)")
        wait_for(lambda: celery_app.recorder.of("vanilla"), timeout=self.COUNTDOWN + 10, message="the vanilla task")
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
        replies = wait_for_counters(celery_app, [celery_worker.hostname], lambda c: True,
                                    message="the worker to answer 'inspect ladder'")
        assert replies[celery_worker.hostname]["relay"] is False


@pytest.mark.parametrize("given,expected", [(None, "classic"), ("classic", "classic"), ("quorum", "quorum"),
                                            (" Quorum ", "quorum")])
def test_ladder_queue_type_reads_classic_or_quorum(given: Any, expected: str) -> None:
    assert LadderSettings.from_conf({"ladder_queue_type": given}).queue_type == expected
    app = celery_ladder.install(Celery("x", broker="memory://", set_as_current=False))
    app.conf.ladder_queue_type = given
    assert app.amqp.Producer(app.connection_for_write().default_channel).queue_type == expected


@pytest.mark.parametrize("bad", ["mirrored", "stream", 1, True])
def test_a_bad_ladder_queue_type_names_the_setting(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"ladder_queue_type \(CELERY_LADDER_QUEUE_TYPE in Django settings\) "
                                         r"must be \"classic\" .* or \"quorum\""):
        LadderSettings.from_conf({"ladder_queue_type": bad})


def test_the_relay_bootstep_declares_the_configured_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    from kombu_ladder.errors import TopologyConflict

    app = celery_ladder.install(Celery("x", broker="memory://", set_as_current=False))
    app.conf.ladder_queue_type = "quorum"
    declared: list[str] = []

    def declare(channel: Any, queue_type: str = "classic") -> list[str]:
        declared.append(queue_type)
        raise TopologyConflict("acemq.schedule.1h", {}, "inequivalent arg 'x-overflow'", queue_type=queue_type)

    monkeypatch.setattr("kombu_ladder.relay.driver.declare", declare)

    class Consumer:
        pass

    c = Consumer()
    c.app = app  # type: ignore[attr-defined]
    c.connection = app.connection_for_write()  # type: ignore[attr-defined]
    step = LadderRelay(c)
    step.start(c)
    assert declared == ["quorum"] and c.ladder_relay is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("given,expected", [(None, 64 * 1024 * 1024), (1048576, 1048576), (" 2097152 ", 2097152)])
def test_ladder_hold_bytes_reaches_the_workers_relay(given: Any, expected: int) -> None:
    app = celery_ladder.install(Celery("x", broker="memory://", set_as_current=False))
    app.conf.ladder_hold_bytes = given

    class Consumer:
        pass

    consumer = Consumer()
    consumer.app = app  # type: ignore[attr-defined]
    step = LadderRelay(consumer)
    assert step.relay.options.hold_bytes == expected
    assert step.relay.core.held.budget == expected


@pytest.mark.parametrize("bad", [0, -1, "1 MiB", 1.5, True])
def test_a_bad_ladder_hold_bytes_names_the_setting_when_the_worker_starts(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"ladder_hold_bytes \(CELERY_LADDER_HOLD_BYTES in Django settings\)"):
        LadderSettings.from_conf({"ladder_hold_bytes": bad})
