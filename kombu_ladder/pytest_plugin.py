"""pytest fixtures for code that schedules through the ladder: ``ladder_broker`` (the simulator)."""

from __future__ import annotations

import os
from importlib.util import find_spec
from typing import Any, Iterator

import pytest

from .relay import Relay
from .simulator import SimulatedBroker
from .simulator.profiles import DEFAULT, PROFILES

__all__ = ["ladder_broker", "simulated_rabbitmq", "OPTION", "ENVIRON"]

#: celery_ladder's fixtures (``ladder_celery``) come along when Celery is installed (``kombu-ladder[celery]``).
#: This is the package's one pytest11 entry point, so a kombu-only install never imports celery_ladder.
pytest_plugins = ["celery_ladder.pytest_plugin"] if find_spec("celery") is not None else []

#: The marker that configures ``ladder_broker`` for one test.
MARKER = "ladder_broker"

#: The pytest option that picks the RabbitMQ release the simulator behaves as.
OPTION = "--ladder-rabbitmq"

#: The environment variable that sets the option's default.
ENVIRON = "LADDER_SIMULATOR_RABBITMQ"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION, default=os.environ.get(ENVIRON, DEFAULT), choices=sorted(PROFILES),
        help=f"RabbitMQ release the ladder simulator behaves as (default {DEFAULT}, or ${ENVIRON})",
    )


def simulated_rabbitmq(config: pytest.Config) -> str:
    """The RabbitMQ release the simulator fixtures use in this test session."""
    return str(config.getoption(OPTION))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(start=None, relay=True, rabbitmq=None): configure the ladder_broker fixture (virtual "
        f"start time, whether a relay runs, the RabbitMQ release, by default {OPTION})",
    )


@pytest.fixture
def ladder_broker(request: pytest.FixtureRequest) -> Iterator[SimulatedBroker]:
    """An in-memory RabbitMQ with the ladder declared and a relay running, on a virtual clock.

    Use ``ladder_broker.connection()`` for a kombu Connection, pass
    ``clock=ladder_broker.now`` to anything that schedules, move time with
    ``ladder_broker.advance(seconds)``, and read what reached a queue with
    ``ladder_broker.messages(queue)``, ``take(queue)`` or ``arrivals(queue)``.
    Configure it with ``@pytest.mark.ladder_broker(start=..., relay=False)``.
    """
    marker = request.node.get_closest_marker(MARKER)
    options: dict[str, Any] = dict(marker.kwargs) if marker else {}
    relay = options.pop("relay", True)
    options.setdefault("rabbitmq", simulated_rabbitmq(request.config))
    broker = SimulatedBroker(**options)
    if relay:
        broker.host(Relay())
    try:
        yield broker
    finally:
        broker.close()
