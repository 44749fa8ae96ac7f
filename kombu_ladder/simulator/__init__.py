"""An in-memory RabbitMQ with TTL, dead-lettering and a virtual clock, behind a real kombu transport."""

from __future__ import annotations

from .broker import Arrival, SimulatedBroker, SimulatorStalled
from .registry import SCHEME
from .transport import Transport

__all__ = ["SCHEME", "Arrival", "SimulatedBroker", "SimulatorStalled", "Transport"]
