"""kombu_ladder: deliver messages later on plain RabbitMQ through the AceMQ ladder of TTL queues."""

from __future__ import annotations

from .brokers import install_scheme
from .cancellation.stream import cancel
from .contract import CONTROL, EXCHANGE, PARKING, RUNGS
from .errors import CancellationsUnavailable, LadderError, LadderNotDeclared, TopologyConflict
from .migrate import MoveResult, move
from .parking import ReplayResult, parked_reasons, replay
from .plan import MAX_DELAY, hops_for
from .producer import LadderProducer, LadderProducerMixin
from .relay import Relay
from .republishing import original_routing_key, republish_count
from .rescheduling import Rescheduled, reschedule
from .scheduler import Scheduler
from .topology import declare

# The one thing importing kombu_ladder does: name the simulator's transport in kombu's table, so a
# ``ladder-sim://<name>`` URL alone (in a Celery settings file, say) resolves. Nothing is created or started.
install_scheme()

__version__ = "0.1.0"

__all__ = [
    # publishing and relaying
    "Scheduler",
    "LadderProducer",
    "LadderProducerMixin",
    "Relay",
    "declare",
    "cancel",
    "original_routing_key",
    "republish_count",
    # operating
    "parked_reasons",
    "replay",
    "ReplayResult",
    "reschedule",
    "Rescheduled",
    "move",
    "MoveResult",
    # the contract's names and limits
    "CONTROL",
    "EXCHANGE",
    "PARKING",
    "RUNGS",
    "MAX_DELAY",
    "hops_for",
    # errors
    "LadderError",
    "TopologyConflict",
    "LadderNotDeclared",
    "CancellationsUnavailable",
]
