"""What differs between the Celery releases ladder supports (5.3 to 5.7), in one place."""

from __future__ import annotations

from typing import Any

import celery

__all__ = ["NATIVE_DELAYED_DELIVERY", "add_choice", "allow_inspect_command"]

#: Celery 5.5 added native delayed delivery: with a quorum queue in ``app.amqp.queues``
#: (and a non-direct exchange), ``send_task`` readdresses countdown/ETA tasks to the
#: ``celery_delayed_*`` exchanges, and workers declare that topology. Before 5.5 a task
#: is never readdressed, so :class:`~celery_ladder.publish.RouteKeeper` has nothing to undo.
NATIVE_DELAYED_DELIVERY: bool = celery.VERSION >= (5, 5)


def add_choice(command: Any, param_name: str, value: str) -> bool:
    """Add ``value`` to the ``click.Choice`` of ``command``'s parameter ``param_name``.

    Returns whether the parameter was found with a choice list (the value may already be in it).
    """
    for param in command.params:
        if param.name == param_name and hasattr(param.type, "choices"):
            choices = tuple(param.type.choices)
            if value not in choices:
                param.type.choices = (*choices, value)
            return True
    return False


def allow_inspect_command(name: str) -> None:
    """Let ``celery inspect <name>`` through the CLI's argument check.

    Celery 5.3 types ``celery inspect``'s argument as a ``click.Choice`` of the
    inspect commands known when ``celery.bin.control`` is imported, which is before
    the ``celery.commands`` plugins load, so a plugin's command is refused as an
    invalid choice. From Celery 5.4 the argument is any name, checked when the
    command runs (by then the plugin has registered it), and there is no choice to
    extend. Idempotent.
    """
    from celery.bin.control import inspect

    add_choice(inspect, "action", name)
