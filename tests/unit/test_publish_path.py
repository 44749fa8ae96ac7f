"""Issue 14: the delayed publish path's shortcuts read exactly what the long way reads."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

celery = pytest.importorskip("celery")

from celery.utils.time import maybe_iso8601  # noqa: E402

from celery_ladder.publish import conf_value, task_eta  # noqa: E402
from kombu_ladder.plan import delay_seconds  # noqa: E402

NAMES = ("ladder_enabled", "ladder_max_delay", "ladder_relay", "timezone", "task_default_queue", "broker_url")


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
def test_conf_value_reads_what_conf_get_reads_and_follows_changes_at_run_time(app: Any) -> None:
    cache: dict[str, Any] = {}
    conf = app.conf
    assert conf_value(conf, "ladder_enabled", cache) == conf.get("ladder_enabled")  # before it is loaded
    for name in NAMES:
        assert conf_value(conf, name, cache) == conf.get(name), name
    conf.ladder_enabled = True
    assert conf_value(conf, "ladder_enabled", cache) is True
    del conf["ladder_enabled"]
    assert conf_value(conf, "ladder_enabled", cache) == conf.get("ladder_enabled")


def test_conf_value_of_a_plain_mapping_is_its_get() -> None:
    assert conf_value({"ladder_enabled": False}, "ladder_enabled", {}) is False
    assert conf_value({}, "ladder_enabled", {}) is None


@pytest.mark.parametrize("value", [
    (datetime.now(timezone.utc) + timedelta(seconds=3600)).isoformat(),  # what Celery writes
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
