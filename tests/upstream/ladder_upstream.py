"""pytest plugin for Celery's own integration suite: the ladder on its apps, the relay in its worker.

Loaded (``-p ladder_upstream``) only in the run with the ladder. It calls
:func:`celery_ladder.install` on every app the suite's fixtures make (the tests'
``celery_app`` and the session worker's ``celery_session_app``), so every countdown,
ETA and retry goes through the ladder and the session worker runs the relay and
adoption. At the end it writes what the ladder did to ``$LADDER_UPSTREAM_REPORT``: a
run where it did nothing would compare nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any, Generator

import pytest

import celery_ladder
from celery_ladder.adoption import adoption_counts
from celery_ladder.publish import scheduled_count

#: The fixtures whose app gets the ladder.
APP_FIXTURES = ("celery_app", "celery_session_app")

_relays: list[Any] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Generator[None, Any, None]:
    outcome = yield
    if outcome.excinfo is not None:
        return
    value = outcome.get_result()
    if fixturedef.argname in APP_FIXTURES and value is not None:
        celery_ladder.install(value)
    elif fixturedef.argname == "celery_session_worker":
        step = getattr(getattr(value, "consumer", None), "ladder_relay", None)
        if step is not None:
            _relays.append(step.counters)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("LADDER_UPSTREAM_REPORT")
    if not path:
        return
    relayed: dict[str, int] = {}
    for counters in _relays:
        for name, value in counters.as_dict().items():
            relayed[name] = relayed.get(name, 0) + value
    report = {"scheduled": scheduled_count(), "relay_workers": len(_relays), "relay": relayed, **adoption_counts()}
    with open(path, "w") as out:
        json.dump(report, out, indent=2, sort_keys=True)
