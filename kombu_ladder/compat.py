"""What differs between the kombu releases ladder supports (5.3 to 5.7), in one place."""

from __future__ import annotations

import inspect

from kombu import Producer

__all__ = ["PUBLISH_OPTIONS"]

#: ``kombu.Producer.publish`` options the ladder passes on unchanged when it re-addresses a
#: publish into a rung. ``confirm_timeout`` exists from kombu 5.5 on (kombu 5.3 and 5.4 have
#: no such parameter: passing it there ends up among the AMQP properties).
PUBLISH_OPTIONS: tuple[str, ...] = tuple(
    name for name in ("priority", "mandatory", "retry", "retry_policy", "declare", "timeout", "confirm_timeout")
    if name in inspect.signature(Producer.publish).parameters
)
