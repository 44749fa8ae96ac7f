"""The options both command lines share (``kombu-ladder`` and ``celery ladder``): click decorators and types."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional, Union

import click

from ..cancellation.records import check_id
from ..rescheduling import due_from
from ..times import read_duration, read_time
from ..tuning import TUNABLES

__all__ = [
    "Number", "MessageId", "When", "NEGATIVE_ARGUMENTS", "MANY", "MAX_SECONDS",
    "shared_option", "parked_option", "due_option", "json_option", "limit_option", "match_option",
    "tunable_option", "tunable_options", "given", "report_every_option",
    "queue_type_option", "metrics_port_option", "metrics_address_option", "metrics_interval_option",
]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

#: The most messages a count option takes (``--limit``, ``--parked``...): a billion, beyond any real queue.
MANY = 10**9

#: The longest a plain duration option may be (a day): a longer timeout or interval is a typo.
MAX_SECONDS = 86400.0

E_NOT_A_NUMBER = "{value!r} is not a {kind}."
E_NOT_FINITE = "{value} is not a finite number."
E_OUT_OF_RANGE = "{value} is not in the range {range}."


class Number(click.FloatRange):
    """A finite number between two bounds, for every numeric option of both command lines.

    ``nan``, ``inf``, ``1e400`` and anything outside ``[min, max]`` are one usage error
    naming the option (``Error: Invalid value for '--x': ...``, exit status 2), never a
    traceback and never a value the command quietly misreads. Both bounds are required:
    an option without an upper bound accepts a timeout of 1e9 s. ``integer=True`` takes
    whole numbers only and returns an ``int``. It is a :class:`click.FloatRange`, so
    ``--help`` shows the range.

    Arguments:
        min: the least value.
        max: the greatest value (finite).
        min_open: exclude ``min`` itself (``min=0, min_open=True``: more than 0).
        max_open: exclude ``max`` itself.
        integer: take whole numbers only.
    """

    def __init__(self, *, min: float, max: float, min_open: bool = False, max_open: bool = False,
                 integer: bool = False, duration: bool = False) -> None:
        if not (math.isfinite(min) and math.isfinite(max) and min <= max):
            raise ValueError(f"a Number needs finite bounds, min <= max, not {min!r} and {max!r}")
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open)
        self.integer = integer
        #: Seconds: a duration (10m, 2h30m; :func:`kombu_ladder.times.read_duration`) is read too.
        self.duration = duration
        self.name = "integer" if integer else "float"

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Union[int, float]:
        number = self._parse(value, param, ctx)
        assert self.min is not None and self.max is not None  # set by __init__
        below = number <= self.min if self.min_open else number < self.min
        above = number >= self.max if self.max_open else number > self.max
        if below or above:
            self.fail(E_OUT_OF_RANGE.format(value=value, range=self._describe_range()), param, ctx)
        return number

    def _parse(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Union[int, float]:
        kind = "whole number" if self.integer else "number"
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(E_NOT_A_NUMBER.format(value=value, kind=kind), param, ctx)
        try:
            as_float = float(value)  # "1e400" reads as inf
        except (ValueError, OverflowError):
            if not self.duration:
                self.fail(E_NOT_A_NUMBER.format(value=value, kind=kind), param, ctx)
            try:
                as_float = read_duration(str(value))
            except ValueError:
                self.fail(E_NOT_A_NUMBER.format(value=value, kind="number of seconds or a duration (10m)"),
                          param, ctx)
        if not math.isfinite(as_float):
            self.fail(E_NOT_FINITE.format(value=value), param, ctx)
        if not self.integer:
            return as_float
        try:
            return int(value)
        except ValueError:  # "1.5", "1e3": a whole number is written in digits
            self.fail(E_NOT_A_NUMBER.format(value=value, kind=kind), param, ctx)

    def _describe_range(self) -> str:
        def text(bound: Any) -> str:
            return str(int(bound)) if self.integer or float(bound).is_integer() else str(bound)

        lower = "<" if self.min_open else "<="
        upper = "<" if self.max_open else "<="
        return f"{text(self.min)}{lower}x{upper}{text(self.max)}"


class MessageId(click.ParamType):
    """An AMQP message id (or Celery task id) argument: non-empty, at most 255 bytes in UTF-8."""

    name = "id"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> str:
        try:
            return check_id(value, argument="an id")
        except (TypeError, ValueError) as exc:
            self.fail(str(exc), param, ctx)


class When(click.ParamType):
    """A new due time, as :func:`kombu_ladder.times.read_time` reads it (seconds or a duration from now, an ISO
    8601 time, UTC without an offset); checked as the move will read it (not past ``max_delay``)."""

    name = "when"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if not isinstance(value, str):
            return value
        try:
            moment = read_time(value, argument="WHEN")
            due_from(moment, time.time(), argument=repr(value))
        except (TypeError, ValueError) as exc:
            self.fail(str(exc).split(": ", 1)[-1] if str(exc).startswith("WHEN: ") else str(exc), param, ctx)
        return moment


#: Context settings of a command whose argument may be negative (``reschedule ID -30``, no ``--`` needed).
NEGATIVE_ARGUMENTS = {"ignore_unknown_options": True}


def _option(*names: str, **fixed: Any) -> Callable[..., Decorator]:
    def factory(**extra: Any) -> Decorator:
        return click.option(*names, **{**fixed, **extra})

    return factory


#: Make an option of the commands both command lines run: ``shared_option("--x", ...)(help=...)``.
shared_option = _option

#: ``status --parked N``.
parked_option = _option(
    "--parked", type=Number(min=0, max=MANY, integer=True), default=100, show_default=True, metavar="N",
    help="Tally the parked reasons of the first N parked messages (0: none); they are only looked at.")
#: ``status --due``.
due_option = _option("--due", is_flag=True, help="Also bound how many messages fall due within a minute, an "
                                                  "hour and a day, from the rung depths.")
#: ``status --json``.
json_option = _option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
#: ``replay/move --limit N``.
limit_option = _option("--limit", type=Number(min=1, max=MANY, integer=True), default=None, metavar="N",
                       help="At most N messages.")
#: ``replay --match TEXT``.
match_option = _option("--match", default=None, metavar="TEXT",
                       help="Only messages whose x-ladder-parked-reason contains TEXT.")
#: ``relay --report-every SECONDS``.
report_every_option = _option("--report-every", type=Number(min=0, min_open=True, max=MAX_SECONDS), default=30.0,
                              show_default=True, metavar="SECONDS", help="Log the relay's counters this often.")

def tunable_option(name: str, **extra: Any) -> Decorator:
    """The command-line option of relay option ``name`` (:data:`kombu_ladder.tuning.TUNABLES`): its flag, help and
    bounds, and its environment variable (``KOMBU_LADDER_`` + the name in capitals). It defaults to None: what is
    not given comes from the environment, then the Celery settings (``celery ladder``), then the default."""
    tunable = TUNABLES[name]
    kind: Any
    if tunable.kind == "choice":
        kind = click.Choice(tunable.choices)
    elif tunable.kind == "names":
        kind = click.STRING
        extra.setdefault("multiple", True)
    else:
        kind = Number(min=tunable.least, max=tunable.most, min_open=tunable.least_open,
                      integer=tunable.kind == "count", duration=tunable.kind == "seconds")
    default = tunable.default
    shown = "every exchange" if default is None else f"{default:.15g}" if isinstance(default, float) else default
    env = tunable.env
    return click.option(tunable.option, name, type=kind, default=None, metavar=tunable.metavar, envvar=env,
                        help=f"{tunable.help} [default: {shown}; environment: {env}; setting: {tunable.setting}]",
                        **extra)


def tunable_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Every relay option (:func:`tunable_option`), in the table's order."""
    for name in reversed(TUNABLES):
        f = tunable_option(name)(f)
    return f


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The relay options given on the command line or in the environment (``--allow-exchange``: a list)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items() if v is not None and v != ()}


#: ``declare/check/replay/move --queue-type classic|quorum``.
queue_type_option = _option(
    "--queue-type", type=click.Choice(["classic", "quorum"]), default=None, metavar="classic|quorum",
    help="The queue profile: the contract's classic queues, or replicated quorum queues (off-contract: every "
         "peer on the vhost must choose quorum too) [default: the profile the ladder is declared with, else "
         "classic].")
#: ``relay --metrics-port PORT``.
metrics_port_option = _option(
    "--metrics-port", type=Number(min=0, max=65535, integer=True), default=None, metavar="PORT",
    help="Serve Prometheus metrics on this port at /metrics (needs the prometheus extra; 0: any free port).")
#: ``relay --metrics-address ADDRESS``.
metrics_address_option = _option("--metrics-address", default="127.0.0.1", show_default=True, metavar="ADDRESS",
                                 help="The address --metrics-port listens on (0.0.0.0: every interface).")
#: ``relay --metrics-interval SECONDS``.
metrics_interval_option = _option(
    "--metrics-interval", type=Number(min=0, min_open=True, max=MAX_SECONDS), default=15.0, show_default=True,
    metavar="SECONDS", help="Sample the ladder's queue depths this often for the metrics (never per scrape).")
