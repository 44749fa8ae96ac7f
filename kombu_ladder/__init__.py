"""kombu_ladder: deliver messages later on plain RabbitMQ through the AceMQ ladder of TTL queues."""

from __future__ import annotations

from .cancelling import cancel
from .contract import CONTROL, EXCHANGE, PARKING, RUNGS, arguments_for, describe, rung_name
from .errors import LadderError, TopologyConflict
from .plan import MAX_DELAY, hops_for
from .producer import LadderProducer, LadderProducerMixin
from .relay import Counters, Relay, RelayCore
from .scheduler import Scheduler, original_routing_key, republish_count
from .topology import declare

__version__ = "0.1.0"

__all__ = [
    "CONTROL",
    "EXCHANGE",
    "PARKING",
    "RUNGS",
    "MAX_DELAY",
    "Counters",
    "LadderError",
    "LadderProducer",
    "LadderProducerMixin",
    "Relay",
    "RelayCore",
    "Scheduler",
    "TopologyConflict",
    "arguments_for",
    "cancel",
    "declare",
    "describe",
    "hops_for",
    "original_routing_key",
    "republish_count",
    "rung_name",
]
