"""RelayOptions: a relay's tuning, declared once, validated once, carried from every entry point to the core."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from ..contract import PREFETCH
from ..plan import (
    HOLD_BYTES,
    HOLD_CAPACITY,
    HOLD_WINDOW,
    MAX_DELAY,
    check_hold_bytes,
    check_hold_capacity,
    check_hold_window,
    check_max_delay,
)
from ..topology import check_queue_type

__all__ = ["RelayOptions", "MAX_REFUSALS", "taking_options"]

#: Retries of a delivery refused through the default exchange (one queue: a retry duplicates nothing).
MAX_REFUSALS = 5

E_POSITIONAL = "RelayOptions takes keyword arguments only (got {} positional)"
E_UNKNOWN = "unknown relay option(s) {}: the options are {}"

F = TypeVar("F", bound=Callable[..., Any])


def _count(value: object, name: str, *, least: int, most: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        bound = f"between {least} and {most}" if most is not None else f"at least {least}"
        raise ValueError(f"{name} must be an integer {bound}, not {value!r}")
    return value


@dataclass(frozen=True)
class RelayOptions:
    """How a relay is tuned: one frozen object, keyword-only, validated when it is made.

    Every entry point takes these (``Scheduler``, :class:`~kombu_ladder.relay.Relay`,
    ``kombu-ladder relay``, the Celery bootstep, the simulator's relay) and hands the
    object on unchanged to :class:`~kombu_ladder.relay.RelayCore`. A bad value raises
    ``ValueError`` or ``TypeError`` naming the option.
    """

    #: Expired messages the relay takes at once for hops and deliveries (the contract's 50); the
    #: messages it holds get room of their own on top (``hold_capacity``).
    prefetch: int = PREFETCH
    #: The target exchanges the relay may deliver to (``""`` is the default exchange); others are
    #: parked. None allows every exchange.
    allowed_exchanges: Optional[frozenset[str]] = None
    #: Seconds: a message due further ahead is parked as malformed (a due time in the wrong unit).
    max_delay: float = float(MAX_DELAY)
    #: Seconds: a message with less than this left is held unacked and delivered at its due time
    #: (0 turns holding off: deliveries are then up to 1 s early, as AceMQ's).
    hold_window: float = HOLD_WINDOW
    #: Messages held at most; beyond that the relay falls back to the 1 s rung.
    hold_capacity: int = HOLD_CAPACITY
    #: Bytes (bodies and properties) held at most (64 MiB): over it the relay takes no new messages
    #: until held ones are delivered (a message bigger than this is still held, alone).
    hold_bytes: int = HOLD_BYTES
    #: How many times a delivery the broker refuses (nacks) through the default exchange is retried.
    max_refusals: int = MAX_REFUSALS
    #: The queue profile the relay declares: "classic" (the contract) or "quorum" (see :func:`~kombu_ladder.declare`).
    queue_type: str = "classic"

    def __new__(cls, *args: Any, **kwargs: Any) -> "RelayOptions":
        if args:
            raise TypeError(E_POSITIONAL.format(len(args)))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        exchanges = self.allowed_exchanges
        if isinstance(exchanges, (str, bytes)):
            raise TypeError("allowed_exchanges must be an iterable of exchange names, not a str")
        if exchanges is not None:
            exchanges = frozenset(exchanges)
            wrong = sorted(repr(e) for e in exchanges if not isinstance(e, str))
            if wrong:
                raise TypeError(f"allowed_exchanges must hold exchange names (str), not {', '.join(wrong)}")
        fixed = {
            "prefetch": _count(self.prefetch, "prefetch", least=1, most=65535),
            "allowed_exchanges": exchanges,
            "max_delay": check_max_delay(self.max_delay),
            "hold_window": check_hold_window(self.hold_window),
            "hold_capacity": check_hold_capacity(self.hold_capacity),
            "hold_bytes": check_hold_bytes(self.hold_bytes),
            "max_refusals": _count(self.max_refusals, "max_refusals", least=0),
            "queue_type": check_queue_type(self.queue_type),
        }
        for name, value in fixed.items():
            object.__setattr__(self, name, value)

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
