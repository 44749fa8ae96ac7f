"""LadderSettings: the ladder's Celery settings, read and validated in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["LadderSettings", "SETTINGS", "as_bool"]

#: Each setting's app.conf name -> (default, its Django settings.py name).
SETTINGS: dict[str, tuple[bool, str]] = {
    "ladder_enabled": (True, "CELERY_LADDER_ENABLED"),
    "ladder_relay": (True, "CELERY_LADDER_RELAY"),
}

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


@dataclass(frozen=True)
class LadderSettings:
    """The ladder's settings for one Celery app."""

    #: Publish ``countdown``/``eta`` tasks into the ladder; False restores Celery's own path.
    enabled: bool = True
    #: Run the relay as a consumer bootstep in this app's workers.
    relay: bool = True

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> "LadderSettings":
        """Read ``ladder_enabled`` and ``ladder_relay`` from a Celery ``app.conf``.

        A setting that is absent or ``None`` takes its default (True).

        Raises:
            ValueError: a setting has a value that is not a boolean.
        """
        values = {}
        for name, (default, _) in SETTINGS.items():
            value = conf.get(name)
            values[name] = default if value is None else as_bool(name, value)
        return cls(enabled=values["ladder_enabled"], relay=values["ladder_relay"])
