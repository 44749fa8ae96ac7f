"""What differs between the kombu releases ladder supports (5.3 to 5.7), in one place."""

from __future__ import annotations

import inspect
from typing import Any

import click
from kombu import Producer

__all__ = ["PUBLISH_OPTIONS", "RETRIED_DECLARES", "current_batch", "is_no_args_help"]

#: ``kombu.Producer.publish`` options the ladder passes on unchanged when it re-addresses a
#: publish into a rung. ``confirm_timeout`` exists from kombu 5.5 on (kombu 5.3 and 5.4 have
#: no such parameter: passing it there ends up among the AMQP properties).
PUBLISH_OPTIONS: tuple[str, ...] = tuple(
    name for name in ("priority", "mandatory", "retry", "retry_policy", "declare", "timeout", "confirm_timeout")
    if name in inspect.signature(Producer.publish).parameters
)

#: kombu 5.5 (the release that added ``confirm_timeout``) declares a publish's ``declare`` entities
#: with its retry policy and copies that policy into the connection's transport options; kombu 5.3
#: and 5.4 declare them once, without retrying.
RETRIED_DECLARES: bool = "confirm_timeout" in inspect.signature(Producer.publish).parameters


def current_batch(producer: Any) -> Any:
    """The :meth:`kombu.Producer.batch` a publish on this thread joins (kombu 5.7), or None."""
    return getattr(getattr(producer, "_batch_local", None), "current", None)


def is_no_args_help(error: click.UsageError) -> bool:
    """Whether ``error`` is click's "called without a command: show the help".

    click 8.2 raises ``NoArgsIsHelpError`` (a usage error, exit status 2) for a group
    called without a command; click 8.1, the newest for Python 3.9, prints the help and
    exits 0 by itself and has no such class.
    """
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", None)
    return no_args is not None and isinstance(error, no_args)
