"""Issue 14: the delayed publish path's shortcuts read exactly what the long way reads."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

celery = pytest.importorskip("celery")

from celery.utils.time import maybe_iso8601  # noqa: E402

from celery_ladder.publish import task_eta  # noqa: E402
from celery_ladder.settings import SETTINGS, LadderSettings, SettingsCache  # noqa: E402
from kombu_ladder.plan import delay_seconds  # noqa: E402


def _apps() -> list[Any]:
    plain = celery.Celery("plain", set_as_current=False)
    plain.conf.update(ladder_enabled=False)
    spaced = celery.Celery("spaced", set_as_current=False)
    spaced.config_from_object({"CELERY_LADDER_ENABLED": False, "ladder_max_delay": 5, "CELERY_TIMEZONE": "UTC"},
                              namespace="CELERY")
    pending = celery.Celery("pending", set_as_current=False)  # not configured yet
    old_style = celery.Celery("old", set_as_current=False)  # Celery 3 spellings, which Celery still reads
    old_style.config_from_object({"CELERY_TIMEZONE": "Europe/Paris", "CELERY_DEFAULT_QUEUE": "jobs"})
    return [plain, spaced, pending, old_style]


@pytest.mark.parametrize("app", _apps(), ids=["plain", "namespace", "pending", "old-style"])
def test_the_cache_reads_what_conf_get_reads_and_follows_changes_at_run_time(app: Any) -> None:
    cache = SettingsCache(lambda: app.conf)
    conf = app.conf
    assert cache.get() == LadderSettings.from_conf(conf)  # loads a pending configuration, as conf.get does
    for value in (True, "off", 1, False):
        conf.ladder_enabled = value
        assert cache.get() == LadderSettings.from_conf(conf), value
    conf["CELERY_LADDER_ENABLED"] = True  # a second spelling: which one wins is Celery's lookup's to say
    assert cache.get() == LadderSettings.from_conf(conf)
    conf["CELERY_LADDER_ENABLED"] = False
    assert cache.get() == LadderSettings.from_conf(conf)
    conf.ladder_max_delay = 60
    assert cache.get().max_delay == LadderSettings.from_conf(conf).max_delay
    del conf["ladder_enabled"]
    assert cache.get() == LadderSettings.from_conf(conf)


@pytest.mark.parametrize("app", _apps(), ids=["plain", "namespace", "pending", "old-style"])
def test_a_setting_the_publish_does_not_watch_is_read_again_when_everything_is_asked_for(app: Any) -> None:
    cache = SettingsCache(lambda: app.conf)
    assert cache.get().queue_type == "classic"
    app.conf.ladder_queue_type = "quorum"
    assert cache.get(everything=True).queue_type == "quorum"
    app.conf.ladder_hold_window = "nonsense"
    with pytest.raises(ValueError, match="ladder_hold_window"):
        cache.get(everything=True)


def test_the_cache_of_a_plain_mapping_reads_its_get() -> None:
    conf: dict[str, Any] = {"ladder_enabled": False}
    cache = SettingsCache(lambda: conf)
    assert cache.get().enabled is False
    conf["ladder_enabled"] = True
    assert cache.get().enabled is True
    assert cache.get() == LadderSettings(enabled=True)


def test_a_reading_made_as_a_message_is_built_serves_that_tasks_publish_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """apply_async reads the settings as Celery builds the message (its countdown) and as it publishes it: the
    publish takes the first reading, for that task id, once, within HELD_FOR; anything else reads again."""
    import celery_ladder.settings as settings_module

    conf: dict[str, Any] = {"ladder_enabled": True}
    cache = SettingsCache(lambda: conf)
    now = [100.0]
    monkeypatch.setattr(settings_module.time, "monotonic", lambda: now[0])
    assert cache.read_for("t-1").enabled is True
    conf["ladder_enabled"] = False  # changed between the two: this publish goes as its message was built
    assert cache.reading_for("t-1").enabled is True
    assert cache.reading_for("t-1").enabled is False  # used once: the next publish of the id reads again
    cache.read_for("t-2")
    conf["ladder_enabled"] = True
    assert cache.reading_for("t-3").enabled is True  # another task: read again
    assert cache.reading_for("t-2").enabled is True  # and the kept reading was given up with it
    cache.read_for("t-4")
    conf["ladder_enabled"] = False
    now[0] += settings_module.HELD_FOR + 0.1
    assert cache.reading_for("t-4").enabled is False  # kept too long: read again
    assert cache.reading_for(None).enabled is False


def test_one_table_names_every_field_of_the_settings() -> None:
    from dataclasses import fields

    assert [s.field for s in SETTINGS] == [f.name for f in fields(LadderSettings)]
    assert LadderSettings() == LadderSettings.from_conf({})
    assert all(s.django == "CELERY_" + s.name.upper() for s in SETTINGS)


@pytest.mark.parametrize("value", [
    pytest.param((datetime.now(timezone.utc) + timedelta(seconds=3600)).isoformat(),  # what Celery writes
                 id="in-an-hour"),  # one id in every process: xdist workers compare them
    "2030-01-01T00:00:00+00:00",
    "2030-01-01T00:00:00.500000+02:00",
    "2030-01-01T00:00:00Z",             # not an isoformat() output: the long way
    "2030-01-01T00:00:00.5+00:00",      # neither
    "20300101T000000+0000",             # basic format: the long way
])
def test_task_eta_reads_the_moment_the_worker_reads(value: str) -> None:
    assert task_eta(value, timezone.utc) == maybe_iso8601(value)
    assert task_eta(value, timezone.utc).tzinfo is not None


def test_task_eta_of_a_naive_header_is_made_aware_the_workers_way() -> None:
    from celery.utils.time import maybe_make_aware

    two = timezone(timedelta(hours=2))
    assert task_eta("2030-01-01T00:00:00", two) == maybe_make_aware(maybe_iso8601("2030-01-01T00:00:00"), two)


@pytest.mark.parametrize("value,error", [(float("nan"), ValueError), (float("inf"), ValueError),
                                          (-float("inf"), ValueError), (True, TypeError), ("1", TypeError)])
def test_delay_fast_path_refuses_what_the_long_way_refuses(value: Any, error: type) -> None:
    with pytest.raises(error, match="countdown"):
        delay_seconds(value, argument="countdown")
