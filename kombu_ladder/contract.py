"""The AceMQ scheduler wire contract: names, TTLs, arguments and headers."""

from __future__ import annotations

__all__ = [
    "EXCHANGE",
    "EXCHANGE_TYPE",
    "CONTROL",
    "PARKING",
    "RUNGS",
    "MESSAGE_TYPE",
    "PREFETCH",
    "TARGET_EXCHANGE",
    "TARGET_ROUTING_KEY",
    "DUE_AT",
    "CONTENT_TYPE",
    "SCHEDULE_HEADERS",
    "PARKED_REASON",
    "PARKED_AT",
    "ORIGINAL_ROUTING_KEY",
    "REPUBLISH_COUNT",
    "describe",
    "rung_name",
    "arguments_for",
    "rung_names",
]

#: Where a message waits, and where it comes back to be re-examined.
EXCHANGE = "acemq.schedule"

#: The exchange type: direct, durable.
EXCHANGE_TYPE = "direct"

#: The queue every expired message returns to.
CONTROL = "acemq.schedule.due"

#: The rungs, longest first, in seconds.
RUNGS: tuple[int, ...] = (3600, 600, 60, 10, 1)

#: The AMQP ``type`` property of a scheduled message.
MESSAGE_TYPE = "ScheduledMessage"

#: How many expiries the control consumer holds at once.
PREFETCH = 50

#: Header: the exchange the message should eventually go to (``""`` is the default exchange).
TARGET_EXCHANGE = "x-schedule-exchange"

#: Header: the routing key the message should eventually carry.
TARGET_ROUTING_KEY = "x-schedule-routing-key"

#: Header: when it is due, as integer epoch milliseconds.
DUE_AT = "x-schedule-due-at"

#: Header: the payload's content type when it was scheduled.
CONTENT_TYPE = "x-schedule-content-type"

#: Every header the scheduler adds; all of them are stripped on delivery.
SCHEDULE_HEADERS: tuple[str, ...] = (TARGET_EXCHANGE, TARGET_ROUTING_KEY, DUE_AT, CONTENT_TYPE)

# -- Local to this library (not part of the shared contract) ---------------

#: Where the relay parks what it cannot deliver: unroutable or malformed messages.
#: Not an AceMQ name; it is bound to nothing, so no other library is affected.
PARKING = "acemq.schedule.parked"

#: Header on a parked message: why it was parked.
PARKED_REASON = "x-ladder-parked-reason"

#: Header on a parked message: when it was parked, as epoch milliseconds.
PARKED_AT = "x-ladder-parked-at"

#: Header on a republished message: the routing key it was originally consumed with.
ORIGINAL_ROUTING_KEY = "x-ladder-original-routing-key"

#: Header on a republished message: how many times it has been republished.
REPUBLISH_COUNT = "x-ladder-republish-count"


def _millis(seconds: float) -> int:
    """Return ``seconds`` in whole milliseconds, rounded half away from zero like Ruby's ``round``."""
    millis = abs(seconds) * 1000
    rounded = int(millis) + (1 if millis - int(millis) >= 0.5 else 0)
    return rounded if seconds >= 0 else -rounded


def describe(seconds: float) -> str:
    """Render a duration as the contract names it: ``1h``, ``10m``, ``10s``.

    A duration divisible by an hour renders as ``{n}h``, by a minute as
    ``{n}m``, and anything else as ``{n}s`` (Java's ``describe``, to the letter).
    """
    millis = _millis(seconds)
    if millis % 3_600_000 == 0:
        return f"{millis // 3_600_000}h"
    if millis % 60_000 == 0:
        return f"{millis // 60_000}m"
    return f"{millis // 1000}s"


def rung_name(seconds: float) -> str:
    """Return the queue a delay of ``seconds`` waits in, e.g. ``acemq.schedule.1m``."""
    return f"{EXCHANGE}.{describe(seconds)}"


def arguments_for(seconds: float) -> dict[str, object]:
    """Return the arguments a rung queue has to carry, and the whole of them."""
    return {
        "x-message-ttl": _millis(seconds),
        "x-dead-letter-exchange": EXCHANGE,
        "x-dead-letter-routing-key": CONTROL,
    }


def rung_names() -> list[str]:
    """Return the rung queue names, longest first."""
    return [rung_name(r) for r in RUNGS]
