"""Every tuning option of a relay, declared once: from this table come the Python keyword checks
(:class:`~kombu_ladder.relay.RelayOptions`), both command lines' options, the Celery and Django settings
and the docs' settings table (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from numbers import Real
from typing import Any, Optional

from .contract import PREFETCH
from .times import read_duration

__all__ = [
    "Tunable", "TUNABLES", "CONSOLE", "PRECEDENCE", "MAX_DELAY", "MAX_MAX_DELAY", "HOLD_WINDOW", "HOLD_CAPACITY",
    "HOLD_BYTES", "MAX_HOLD_BYTES", "MAX_REFUSALS", "QUEUE_TYPES", "setting_label",
]

#: The default longest delay accepted, in seconds: ten years, leap days included (87,672 one-hour hops). It is
#: no limit of the ladder, which hops any delay an hour at a time as the AceMQ relays do; it catches unit
#: mistakes (a due time in microseconds, milliseconds passed as seconds).
MAX_DELAY = 3653 * 24 * 3600
#: The greatest ``max_delay``: a hundred years.
MAX_MAX_DELAY = 100 * 365.25 * 86400
#: Seconds: what remains below this is held by the relay and delivered at its due time. 10 s is the 10 s
#: rung: no message ever takes a 1 s hop, and a held message waits at most 10 s (far below RabbitMQ's 30 min
#: ``consumer_timeout``); 0 turns holding off (deliveries are then up to 1 s early, as AceMQ's).
HOLD_WINDOW = 10.0
#: Messages one relay holds at most; beyond that it falls back to the 1 s rung.
HOLD_CAPACITY = 2000
#: Bytes (bodies and properties) one relay holds at most: 64 MiB.
HOLD_BYTES = 64 * 1024 * 1024
#: The largest byte budget accepted (64 GiB): a bigger one is a unit mistake.
MAX_HOLD_BYTES = 64 << 30
#: Retries of a delivery refused through the default exchange (one queue: a retry duplicates nothing).
MAX_REFUSALS = 5
#: The queue profiles: the contract's classic queues, or replicated quorum queues (off-contract).
QUEUE_TYPES = ("classic", "quorum")

#: Where a value comes from when it is given in more than one place, first wins (stated once, in the docs).
PRECEDENCE = ("command-line option", "environment variable", "Celery/Django setting", "default")


def setting_label(name: str) -> str:
    """How an error names a setting: its app.conf name and its Django name."""
    return f"setting {name} (CELERY_{name.upper()} in Django settings)"


@dataclass(frozen=True)
class Tunable:
    """One option: its Python keyword, kind, default, bounds and help; its setting and flag follow from the name."""

    #: The keyword (``hold_window``); the setting is ``ladder_`` + it, the flag ``--`` + it with dashes.
    name: str
    #: ``"count"`` (a whole number), ``"seconds"``, ``"names"`` (exchange names) or ``"choice"``.
    kind: str
    default: Any
    #: One sentence or two, for ``--help``, the docs and the docstrings; says what 0 means where 0 is allowed.
    help: str
    least: float = 0
    most: float = 0
    #: ``least`` itself is refused (more than ``least``).
    least_open: bool = False
    metavar: str = "N"
    choices: tuple[str, ...] = ()
    #: The command-line flag when it is not the name's (``--allow-exchange``, repeatable).
    flag: str = ""
    #: The accepted values in words, when the bounds do not say enough.
    accepted: str = ""

    @property
    def setting(self) -> str:
        """The Celery setting (``ladder_hold_window``); Django's is ``CELERY_`` + it in capitals."""
        return f"ladder_{self.name}"

    @property
    def env(self) -> str:
        """The environment variable (``KOMBU_LADDER_HOLD_WINDOW``): over the setting, under the command line."""
        return f"KOMBU_LADDER_{self.name.upper()}"

    @property
    def option(self) -> str:
        """The command-line flag."""
        return self.flag or "--" + self.name.replace("_", "-")

    def bounds(self) -> str:
        """The accepted values in words (``from 0 to 600``)."""
        if self.accepted or self.kind == "choice":
            return self.accepted or " or ".join(f'"{c}"' for c in self.choices)
        if self.kind == "names":
            return "None (every exchange) or a list of exchange names (\"\" is the default exchange)"
        low = f"more than {self.least:g}" if self.least_open else f"from {self.least:g}"
        return f"{low} to {self.most:.15g}"

    def check(self, value: Any, argument: Optional[str] = None) -> Any:
        """``value`` as given in Python, checked: returned as the option holds it.

        Raises:
            TypeError: the wrong type, naming ``argument`` (default: the option's name).
            ValueError: out of bounds, naming ``argument``.
        """
        argument = argument or self.name
        if self.kind == "names":
            if value is None:
                return None
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise TypeError(f"{argument} must be {self.bounds()}, not {value!r}")
            names = frozenset(value)
            wrong = sorted(repr(e) for e in names if not isinstance(e, str))
            if wrong:
                raise TypeError(f"{argument} must hold exchange names (str), not {', '.join(wrong)}")
            return names
        if self.kind == "choice":
            if isinstance(value, str) and value in self.choices:
                return value
            raise ValueError(f"{argument} must be {self.bounds()}, not {value!r}")
        if self.kind == "count":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{argument} must be a whole number {self.bounds()}, not {value!r}")
            number: float = value
        elif isinstance(value, timedelta):
            number = value.total_seconds()
        elif isinstance(value, Real) and not isinstance(value, bool):
            number = float(value)
        else:
            raise TypeError(f"{argument} must be a number of seconds, not {type(value).__name__}: {value!r}")
        below = number <= self.least if self.least_open else number < self.least
        if not math.isfinite(number) or below or number > self.most:
            unit = "" if self.kind == "count" else " seconds"
            raise ValueError(f"{argument} must be {'a whole number ' if unit == '' else ''}{self.bounds()}{unit}, "
                             f"not {value!r}")
        return number

    def read(self, value: Any, argument: str) -> Any:
        """A configured value (a setting, an environment variable: strings too) as :meth:`check` returns it."""
        if isinstance(value, str):
            text = value.strip()
            if self.kind == "choice":
                value = text.lower()
            elif self.kind == "seconds":
                try:
                    value = read_duration(text, argument=argument)
                except ValueError:
                    raise ValueError(f"{argument} must be a number of seconds or a duration (10m), "
                                     f"not {value!r}") from None
            elif self.kind == "count" and text.isdigit():
                value = int(text)
        if self.kind == "names" and value is not None and not isinstance(value, (list, tuple, set, frozenset)):
            raise TypeError(f"{argument} must be {self.bounds()}, not {value!r}")
        return self.check(value, argument)


#: The options, in the order the docs list them.
TUNABLES: dict[str, Tunable] = {t.name: t for t in (
    Tunable("prefetch", "count", PREFETCH, least=1, most=65535,
            help="Expired messages the relay takes at once for hops and deliveries (the contract's 50); held "
                 "messages get room of their own (hold_capacity)."),
    Tunable("hold_window", "seconds", HOLD_WINDOW, most=600, metavar="SECONDS",
            help="Hold a message whose remaining delay is below this, unacked, and deliver it at its due time "
                 "(0: off, deliveries up to 1 s early, as the contract's)."),
    Tunable("hold_capacity", "count", HOLD_CAPACITY, most=60000,
            help="Hold at most this many messages; beyond that a message takes the 1 s rung, up to a second late "
                 "(0: hold none)."),
    Tunable("hold_bytes", "count", HOLD_BYTES, least=1, most=MAX_HOLD_BYTES, metavar="BYTES",
            help="Hold at most this many bytes of messages (bodies and properties); over it the relay takes no "
                 "new messages until held ones are delivered."),
    Tunable("max_delay", "seconds", float(MAX_DELAY), least_open=True, most=MAX_MAX_DELAY, metavar="SECONDS",
            help="Park, as malformed, a message due further ahead than this (default: ten years; a sanity bound "
                 "that catches due times in the wrong unit); producers refuse such a delay. Match it everywhere."),
    Tunable("max_refusals", "count", MAX_REFUSALS, most=1000,
            help="Retry a delivery the broker refuses (nacks) through the default exchange this many times, then "
                 "park it (0: park at the first refusal)."),
    Tunable("allowed_exchanges", "names", None, metavar="NAME", flag="--allow-exchange",
            help="Deliver only to these target exchanges; others are parked (repeatable; '' is the default "
                 "exchange; none given: every exchange)."),
    Tunable("queue_type", "choice", "classic", metavar="classic|quorum", choices=QUEUE_TYPES,
            accepted='"classic" (the AceMQ contract) or "quorum" (replicated quorum queues, off-contract)',
            help="The queue profile: the contract's classic queues, or replicated quorum queues (off-contract: "
                 "every peer on the vhost must choose quorum too)."),
)}

#: The console's numbers (``web``; :class:`~kombu_ladder.web.ConsoleOptions`): command line and Python only.
CONSOLE: dict[str, Tunable] = {t.name: t for t in (
    Tunable("port", "count", 8642, most=65535, metavar="PORT", help="The port to listen on (0: any free port)."),
    Tunable("refresh", "seconds", 5.0, least=1, most=86400, metavar="SECONDS",
            help="Sample queue depths, read the index and poll relays this often, whatever the number of viewers."),
    Tunable("page_size", "count", 50, least=1, most=1000, help="Rows per page of the waiting list."),
    Tunable("look_limit", "count", 50_000, least=1, most=10**7,
            help="Messages looked at, at most, to find one message's headers and body, or to move it."),
    Tunable("preview_bytes", "count", 4096, least=1, most=1 << 20, help="Body bytes a preview shows at most."),
    Tunable("parked_limit", "count", 500, least=1, most=100_000, help="Parked messages the parked page shows."),
)}
