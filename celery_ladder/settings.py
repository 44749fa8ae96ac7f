"""LadderSettings: the ladder's Celery settings, read and validated in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from kombu_ladder.plan import MAX_DELAY, check_max_delay
from kombu_ladder.timing import HOLD_WINDOW, check_hold_window
from kombu_ladder.topology import QUEUE_TYPES

__all__ = [
    "LadderSettings", "SETTINGS", "ALLOWED_EXCHANGES", "MAX_DELAY_SETTING", "METRICS_PORT", "METRICS_ADDRESS",
    "as_bool", "as_exchanges", "as_max_delay", "as_metrics_port", "as_metrics_address", "read_bool",
    "read_max_delay", "as_hold_window", "QUEUE_TYPE", "as_queue_type", "read_queue_type",
]

#: Each setting's app.conf name -> (default, its Django settings.py name).
SETTINGS: dict[str, tuple[bool, str]] = {
    "ladder_enabled": (True, "CELERY_LADDER_ENABLED"),
    "ladder_relay": (True, "CELERY_LADDER_RELAY"),
}

#: The relay's target-exchange allow-list: its app.conf name and its Django settings.py name.
ALLOWED_EXCHANGES = ("ladder_allowed_exchanges", "CELERY_LADDER_ALLOWED_EXCHANGES")

#: The port the workers serve Prometheus metrics on (None: no metrics): app.conf and Django names.
METRICS_PORT = ("ladder_metrics_port", "CELERY_LADDER_METRICS_PORT")

#: The address that port listens on: app.conf and Django names.
METRICS_ADDRESS = ("ladder_metrics_address", "CELERY_LADDER_METRICS_ADDRESS")
#: The longest countdown/ETA accepted, in seconds: its app.conf name and its Django settings.py name.
MAX_DELAY_SETTING = ("ladder_max_delay", "CELERY_LADDER_MAX_DELAY")
#: Seconds below which the relay holds a message and delivers it at its due time (issue 14).
HOLD_WINDOW_SETTING = ("ladder_hold_window", "CELERY_LADDER_HOLD_WINDOW")

#: The ladder's queue profile, "classic" (the contract) or "quorum": app.conf and Django names.
QUEUE_TYPE = ("ladder_queue_type", "CELERY_LADDER_QUEUE_TYPE")

#: Strings accepted for a boolean setting (environment variables and .env files give strings).
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def as_bool(name: str, value: Any) -> bool:
    """Read a boolean setting strictly.

    ``True``/``False``, the integers 0 and 1, and the strings ``true``/``false``,
    ``yes``/``no``, ``on``/``off``, ``1``/``0`` (any case) are accepted.

    Raises:
        ValueError: anything else, naming the setting (and its Django name).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    django = SETTINGS.get(name, (None, None))[1]
    also = f" ({django} in Django settings)" if django else ""
    raise ValueError(f"setting {name}{also} must be a boolean (True/False), not {value!r}")


def read_bool(conf: Mapping[str, Any], name: str) -> bool:
    """Read one boolean setting of :data:`SETTINGS` from ``app.conf``; absent or None is its default.

    The publish path reads ``ladder_enabled`` alone this way: every ``app.conf``
    lookup costs a few microseconds on each task sent.

    Raises:
        ValueError: the value is not a boolean, naming the setting.
    """
    value = conf.get(name)
    return SETTINGS[name][0] if value is None else as_bool(name, value)


def as_exchanges(value: Any) -> Optional[frozenset[str]]:
    """Read ``ladder_allowed_exchanges``: ``None`` (every exchange) or a collection of names.

    ``""`` in the collection stands for the default exchange.

    Raises:
        TypeError: a single string, or anything but a list/tuple/set of strings, naming the setting.
    """
    if value is None:
        return None
    name, django = ALLOWED_EXCHANGES
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise TypeError(
        f"setting {name} ({django} in Django settings) must be None or a list of exchange names "
        f"(\"\" is the default exchange), not {value!r}"
    )


def as_metrics_port(value: Any) -> Optional[int]:
    """Read ``ladder_metrics_port``: None (no metrics) or a TCP port, 0 to 65535 (0: any free port).

    Raises:
        ValueError: anything else, naming the setting.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535:
        return value
    name, django = METRICS_PORT
    raise ValueError(f"setting {name} ({django} in Django settings) must be None or a port number "
                     f"from 0 to 65535, not {value!r}")


def as_metrics_address(value: Any) -> str:
    """Read ``ladder_metrics_address``: the address to listen on; None is 127.0.0.1 (this host only).

    Raises:
        TypeError: not a non-empty string, naming the setting.
    """
    if value is None:
        return "127.0.0.1"
    if isinstance(value, str) and value.strip():
        return value.strip()
    name, django = METRICS_ADDRESS
    raise TypeError(f"setting {name} ({django} in Django settings) must be an address such as \"0.0.0.0\", "
                    f"not {value!r}")
def as_max_delay(value: Any) -> float:
    """Read ``ladder_max_delay``: seconds (a number, a numeric string or a timedelta) above zero.

    ``None`` is the default, :data:`kombu_ladder.plan.MAX_DELAY` (ten years).

    Raises:
        ValueError: not a positive finite number of seconds, naming the setting.
        TypeError: not a number, string or timedelta, naming the setting.
    """
    return float(MAX_DELAY) if value is None else _seconds(value, MAX_DELAY_SETTING, check_max_delay)


def as_hold_window(value: Any) -> float:
    """Read ``ladder_hold_window``: seconds from 0 (off) to 600; ``None`` is the default (10 s).

    Raises:
        ValueError: out of range, or a string that is not a number, naming the setting.
        TypeError: not a number, naming the setting.
    """
    return HOLD_WINDOW if value is None else _seconds(value, HOLD_WINDOW_SETTING, check_hold_window)


def _seconds(value: Any, setting: tuple[str, str], check: Callable[..., float]) -> float:
    """A number of seconds (a numeric string too), checked by ``check`` with the setting named."""
    name, django = setting
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"setting {name} ({django} in Django settings) must be a number of seconds, "
                             f"not {value!r}") from None
    return check(value, argument=f"setting {name} ({django} in Django settings)")


def read_max_delay(conf: Mapping[str, Any]) -> float:
    """Read ``ladder_max_delay`` from ``app.conf`` (see :func:`as_max_delay`)."""
    return as_max_delay(conf.get(MAX_DELAY_SETTING[0]))


def as_queue_type(value: Any) -> str:
    """Read ``ladder_queue_type``: ``"classic"`` (the default, the contract) or ``"quorum"`` (replicated).

    Surrounding blanks and case are forgiven (environment variables).

    Raises:
        ValueError: anything else, naming the setting.
    """
    if value is None:
        return "classic"
    if isinstance(value, str) and value.strip().lower() in QUEUE_TYPES:
        return value.strip().lower()
    name, django = QUEUE_TYPE
    raise ValueError(f"setting {name} ({django} in Django settings) must be \"classic\" (the AceMQ contract, "
                     f"the default) or \"quorum\" (replicated quorum queues, off-contract), not {value!r}")


def read_queue_type(conf: Mapping[str, Any]) -> str:
    """Read ``ladder_queue_type`` from ``app.conf`` (see :func:`as_queue_type`)."""
    return as_queue_type(conf.get(QUEUE_TYPE[0]))


@dataclass(frozen=True)
class LadderSettings:
    """The ladder's settings for one Celery app."""

    #: Publish ``countdown``/``eta`` tasks into the ladder; False restores Celery's own path.
    enabled: bool = True
    #: Run the relay as a consumer bootstep in this app's workers.
    relay: bool = True
    #: Target exchanges the workers' relay may deliver to; ``None`` (the default) allows every one.
    allowed_exchanges: Optional[frozenset[str]] = None
    #: The port the workers' relay serves Prometheus metrics on; None (the default) serves none.
    metrics_port: Optional[int] = None
    #: The address ``metrics_port`` listens on.
    metrics_address: str = "127.0.0.1"
    #: The longest countdown/ETA accepted, in seconds; the relay parks a due time further ahead.
    max_delay: float = float(MAX_DELAY)
    #: Seconds below which the workers' relay holds a message and delivers it at its due time; 0: off.
    hold_window: float = HOLD_WINDOW
    #: The queue profile the relay and the producers declare: "classic" (the contract) or "quorum".
    queue_type: str = "classic"

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> "LadderSettings":
        """Read every ``ladder_*`` setting from ``app.conf``.

        A setting that is absent or ``None`` takes its default.

        Raises:
            ValueError: a boolean setting has a value that is not a boolean,
                ``ladder_metrics_port`` is not a port number, or ``ladder_max_delay``
                is not a positive number of seconds, or ``ladder_queue_type`` is
                neither "classic" nor "quorum".
            TypeError: ``ladder_allowed_exchanges`` is not None or a list of names,
                ``ladder_metrics_address`` is not a string, or ``ladder_max_delay``
                is not a number.
        """
        values = {name: read_bool(conf, name) for name in SETTINGS}
        return cls(enabled=values["ladder_enabled"], relay=values["ladder_relay"],
                   allowed_exchanges=as_exchanges(conf.get(ALLOWED_EXCHANGES[0])),
                   metrics_port=as_metrics_port(conf.get(METRICS_PORT[0])),
                   metrics_address=as_metrics_address(conf.get(METRICS_ADDRESS[0])),
                   max_delay=read_max_delay(conf), hold_window=as_hold_window(conf.get(HOLD_WINDOW_SETTING[0])),
                   queue_type=read_queue_type(conf))
