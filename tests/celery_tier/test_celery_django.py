"""Django: 'celery_ladder.django' in INSTALLED_APPS installs the ladder; CELERY_LADDER_* toggle it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers import queue_depth

from kombu_ladder.contract import rung_names

from .recording import purge_queues

pytest.importorskip("django")

pytestmark = [pytest.mark.broker, pytest.mark.celery]

HERE = Path(__file__).parent

#: Runs in a fresh interpreter (django.setup() is process-wide): start Django, then publish one ETA task.
SCRIPT = """
import json, django
django.setup()
import celery_ladder
from celery_ladder.settings import LadderSettings
from djproj import celery_app as app
settings = LadderSettings.from_conf(app.conf)
app.send_task("djproj.noop", countdown=30)
print(json.dumps({"installed": celery_ladder.installed(app), "enabled": settings.enabled, "relay": settings.relay}))
"""


def run_django(broker_url: str, enabled: Optional[str] = None, relay: Optional[str] = None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
    env.update(LADDER_TEST_BROKER_URL=broker_url, DJANGO_SETTINGS_MODULE="djproj.settings",
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    if enabled is not None:
        env["LADDER_ENABLED"] = enabled
    if relay is not None:
        env["LADDER_RELAY"] = relay
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("enabled,relay,in_ladder", [
    (None, None, True),
    ("True", "False", True),
    ("False", None, False),
])
def test_installed_apps_and_the_toggles(broker_url: str, connection: Any, enabled: Optional[str],
                                        relay: Optional[str], in_ladder: bool) -> None:
    purge_queues(broker_url, ("django-tasks",))
    done = run_django(broker_url, enabled, relay)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"installed": True, "enabled": in_ladder, "relay": relay != "False"}
    waiting = sum(queue_depth(connection, name, if_missing=0) for name in rung_names())
    assert (waiting, queue_depth(connection, "django-tasks", if_missing=None)) == ((1, 0) if in_ladder else (0, 1))


def test_a_bad_django_setting_stops_the_start_naming_it(broker_url: str) -> None:
    done = run_django(broker_url, enabled="maybe")
    assert done.returncode != 0
    assert "ValueError" in done.stderr and "CELERY_LADDER_ENABLED" in done.stderr
