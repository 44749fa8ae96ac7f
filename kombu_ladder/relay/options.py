"""RelayOptions: a relay's tuning, declared once, validated once, carried from every entry point to the core."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from ..tuning import MAX_REFUSALS, TUNABLES
from ..tuning import TUNABLES as _T

__all__ = ["RelayOptions", "MAX_REFUSALS", "taking_options"]

E_POSITIONAL = "RelayOptions takes keyword arguments only (got {} positional)"
E_UNKNOWN = "unknown relay option(s) {}: the options are {}"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RelayOptions:
    """How a relay is tuned: one frozen object, keyword-only, validated when it is made.

    Every entry point takes these (``Scheduler``, :class:`~kombu_ladder.relay.Relay`,
    ``kombu-ladder relay``, the Celery bootstep, the simulator's relay) and hands the
    object on unchanged to :class:`~kombu_ladder.relay.RelayCore`. A bad value raises
    ``ValueError`` or ``TypeError`` naming the option. The options, their defaults and
    bounds are :data:`kombu_ladder.tuning.TUNABLES` (the configuration reference lists them).
    """

    # One field per entry of kombu_ladder.tuning.TUNABLES (its help, default and bounds; a test compares them).
    prefetch: int = _T["prefetch"].default
    allowed_exchanges: Optional[frozenset[str]] = _T["allowed_exchanges"].default
    max_delay: float = _T["max_delay"].default
    hold_window: float = _T["hold_window"].default
    hold_capacity: int = _T["hold_capacity"].default
    hold_bytes: int = _T["hold_bytes"].default
    max_refusals: int = _T["max_refusals"].default
    queue_type: str = _T["queue_type"].default

    def __new__(cls, *args: Any, **kwargs: Any) -> "RelayOptions":
        if args:
            raise TypeError(E_POSITIONAL.format(len(args)))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name, tunable in TUNABLES.items():  # the checks, bounds and defaults of kombu_ladder.tuning
            object.__setattr__(self, name, tunable.check(getattr(self, name)))

    @classmethod
    def of(cls, options: Optional["RelayOptions"] = None, **values: Any) -> "RelayOptions":
        """``options`` (default: the defaults) with ``values`` changed, for entry points that take both.

        Raises:
            TypeError: a name in ``values`` is not an option (the message names it), or a value's type is wrong.
            ValueError: a value is out of range (the message names the option).
        """
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(E_UNKNOWN.format(", ".join(unknown), ", ".join(f.name for f in dataclasses.fields(cls))))
        base = options if options is not None else cls()
        return dataclasses.replace(base, **values) if values else base

    @property
    def hold_window_ms(self) -> int:
        """The hold window in milliseconds."""
        return round(self.hold_window * 1000)

    @property
    def max_delay_ms(self) -> int:
        """The longest delay accepted, in milliseconds."""
        return round(self.max_delay * 1000)


def taking_options(function: F) -> F:
    """Name each :class:`RelayOptions` field in the signature of ``function``, which takes them as ``**values``.

    The options stay declared once, here, while ``help()``, IDEs and :func:`inspect.signature` show an
    entry point's keyword-only options one by one (``Scheduler.on(conn, hold_window=5)``).
    """
    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in parameters}
    parameters += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                   for f in dataclasses.fields(RelayOptions) if f.name not in taken]
    function.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return function
