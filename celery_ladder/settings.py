"""LadderSettings: the ladder's Celery settings, one table read and validated in one place."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from kombu_ladder.relay import RelayOptions
from kombu_ladder.tuning import TUNABLES, Tunable, setting_label
from kombu_ladder.tuning import TUNABLES as _T

__all__ = [
    "LadderSettings", "Setting", "SETTINGS", "SettingsCache", "PUBLISH_SETTINGS", "HELD_FOR", "django_name", "label",
    "as_bool", "as_exchanges", "as_metrics_port", "as_metrics_address",
]

#: Strings accepted for a boolean setting (environment variables and .env files give strings).
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def django_name(name: str) -> str:
    """The Django settings.py spelling of a setting (Celery's ``namespace="CELERY"``): ``CELERY_LADDER_...``."""
    return f"CELERY_{name.upper()}"


label = setting_label


# -- parsers: (the value as configured, never None; the setting's name) -> the value LadderSettings holds --------

def as_bool(value: Any, name: str = "ladder_enabled") -> bool:
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
    raise ValueError(f"{label(name)} must be a boolean (True/False), not {value!r}")


def as_exchanges(value: Any, name: str = "ladder_allowed_exchanges") -> Optional[frozenset[str]]:
    """Read ``ladder_allowed_exchanges``: ``None`` (every exchange) or a list of names (``""``: the default exchange).

    Raises:
        TypeError: a single string, or anything but a list/tuple/set of strings, naming the setting.
    """
    return TUNABLES["allowed_exchanges"].read(value, label(name))


def as_metrics_port(value: Any, name: str = "ladder_metrics_port") -> int:
    """Read ``ladder_metrics_port``: a TCP port, 0 to 65535 (0: any free port).

    Raises:
        ValueError: anything else, naming the setting.
    """
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535:
        return value
    raise ValueError(f"{label(name)} must be None or a port number from 0 to 65535, not {value!r}")


def as_metrics_address(value: Any, name: str = "ladder_metrics_address") -> str:
    """Read ``ladder_metrics_address``: the address to listen on.

    Raises:
        TypeError: not a non-empty string, naming the setting.
    """
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise TypeError(f"{label(name)} must be an address such as \"0.0.0.0\", not {value!r}")


@dataclass(frozen=True)
class Setting:
    """One ``ladder_*`` setting: its app.conf name, its default and how a configured value is read."""

    #: The app.conf name (``ladder_enabled``); the LadderSettings field is the part after ``ladder_``.
    name: str
    #: The value when the setting is absent or None.
    default: Any
    #: Reads a configured value (never None), raising an error that names the setting.
    parse: Callable[[Any, str], Any]

    @classmethod
    def of(cls, tunable: Tunable) -> "Setting":
        """The setting of a relay option (:data:`kombu_ladder.tuning.TUNABLES`)."""
        return cls(tunable.setting, tunable.default, lambda value, name: tunable.read(value, label(name)))

    @property
    def field(self) -> str:
        """The :class:`LadderSettings` field that holds it."""
        return self.name[len("ladder_"):]

    @property
    def django(self) -> str:
        """Its Django settings.py name."""
        return django_name(self.name)

    def read(self, value: Any) -> Any:
        """The setting's value from a configured one: the default for None, else parsed."""
        return self.default if value is None else self.parse(value, self.name)


#: Every ladder setting of a Celery app: the Celery ones, then one per relay option (kombu_ladder.tuning).
SETTINGS: tuple[Setting, ...] = (
    Setting("ladder_enabled", True, as_bool),
    Setting("ladder_relay", True, as_bool),
    Setting("ladder_adopt", None, as_bool),
    Setting("ladder_index", False, as_bool),
    Setting("ladder_metrics_port", None, as_metrics_port),
    Setting("ladder_metrics_address", "127.0.0.1", as_metrics_address),
    *(Setting.of(tunable) for tunable in TUNABLES.values()),
)

#: The settings an ETA publish reads: :class:`SettingsCache` reads them again on every publish.
PUBLISH_SETTINGS = ("ladder_enabled", "ladder_max_delay", "ladder_index")
#: Seconds a reading made as a task message is built serves its publish (:meth:`SettingsCache.read_for`).
HELD_FOR = 1.0


@dataclass(frozen=True)
class LadderSettings:
    """The ladder's settings for one Celery app (see :data:`SETTINGS` and the configuration reference)."""

    #: Publish ``countdown``/``eta`` tasks into the ladder; False restores Celery's own path.
    enabled: bool = True
    #: Run the relay as a consumer bootstep in this app's workers.
    relay: bool = True
    #: Move ETA tasks sent without the ladder into it (workers); None: when the worker runs the relay.
    adopt: Optional[bool] = None
    #: Append an entry per ETA task to the ``ladder.index`` stream (``celery ladder waiting``).
    index: bool = False
    #: The port the workers' relay serves Prometheus metrics on; None (the default) serves none.
    metrics_port: Optional[int] = None
    #: The address ``metrics_port`` listens on.
    metrics_address: str = "127.0.0.1"
    # The relay's options (kombu_ladder.tuning.TUNABLES: help, defaults, bounds), for the workers' relay and
    # ``celery ladder relay``; max_delay also bounds every ETA publish, queue_type is what producers declare.
    prefetch: int = _T["prefetch"].default
    hold_window: float = _T["hold_window"].default
    hold_capacity: int = _T["hold_capacity"].default
    hold_bytes: int = _T["hold_bytes"].default
    max_delay: float = _T["max_delay"].default
    max_refusals: int = _T["max_refusals"].default
    allowed_exchanges: Optional[frozenset[str]] = _T["allowed_exchanges"].default
    queue_type: str = _T["queue_type"].default

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> "LadderSettings":
        """Read every ``ladder_*`` setting of :data:`SETTINGS` from ``app.conf`` (or a plain mapping).

        A setting that is absent or ``None`` takes its default; a relay option's environment variable
        (``KOMBU_LADDER_HOLD_WINDOW``...) comes before its setting.

        Raises:
            ValueError: a setting has a bad value (a boolean that is not one, a port out of
                range, a delay that is not a positive number of seconds, a queue type that is
                neither "classic" nor "quorum"); the message names it and its Django name.
            TypeError: a setting has the wrong type (``ladder_allowed_exchanges`` not a list of
                names, ``ladder_metrics_address`` not a string, a delay not a number).
        """
        environ = {t.setting: os.environ.get(t.env) for t in TUNABLES.values()}  # over the setting (PRECEDENCE)
        return cls(**{setting.field: setting.read(environ.get(setting.name) or conf.get(setting.name))
                      for setting in SETTINGS})

    def runs_relay(self, pool: Any) -> bool:
        """Whether a worker with this ``pool`` runs the relay: ``-P ladder`` always, else ``relay``."""
        return bool(getattr(pool, "with_relay", False)) or self.relay

    def relay_options(self, **values: Any) -> RelayOptions:
        """The relay's options these settings give (a worker's, ``celery ladder relay``'s); ``values`` override
        them (a command line's)."""
        return RelayOptions.of(RelayOptions(**{name: getattr(self, name) for name in TUNABLES}), **values)

    def adopts(self, *, relay_runs: bool) -> bool:
        """Whether a worker adopts ETA tasks sent without the ladder: ``adopt``, or by default
        when the worker runs the relay and ``enabled`` is true."""
        return self.adopt if self.adopt is not None else (relay_runs and self.enabled)


class SettingsCache:
    """An app's :class:`LadderSettings`, read whole again only when a setting it watches reads differently.

    The publish path asks on every ETA task: the watched settings are read with
    Celery's public ``conf.get`` (its own lookup of every spelling and layer), and
    compared with the last reading; on a change the settings are read again whole.
    A change at run time (``app.conf.ladder_enabled = False``) thus applies to the
    next publish.

    Arguments:
        conf: returns the configuration (``lambda: app.conf``), or a mapping read with its own ``get``.
        watch: the names read on every :meth:`get`; :meth:`get` ``(everything=True)`` compares them all.
    """

    def __init__(self, conf: Callable[[], Any], *, watch: tuple[str, ...] = PUBLISH_SETTINGS) -> None:
        self._conf = conf
        #: The names read by :meth:`get`, and by ``get(everything=True)``.
        self._names = {False: tuple(watch), True: tuple(setting.name for setting in SETTINGS)}
        self._raw: dict[bool, tuple[Any, ...]] = {}
        self._settings: Optional[LadderSettings] = None
        #: Per thread: the reading :meth:`read_for` made for one task id, and when (monotonic seconds).
        self._held = threading.local()

    def get(self, *, everything: bool = False) -> LadderSettings:
        """The settings, read again if a watched setting (any, with ``everything``) changed.

        Raises:
            ValueError, TypeError: a setting has a bad value (see :meth:`LadderSettings.from_conf`).
        """
        conf = self._conf()
        raw = tuple(conf.get(name) for name in self._names[everything])
        settings = self._settings
        if settings is None or raw != self._raw.get(everything):
            settings = LadderSettings.from_conf(conf)
            self._raw = {everything: raw, not everything: tuple(conf.get(name) for name in self._names[not everything])}
            self._settings = settings
        return settings

    def read_for(self, task_id: Any) -> LadderSettings:
        """:meth:`get`, kept for the publish of ``task_id`` that follows on this thread (:meth:`reading_for`).

        ``apply_async`` asks twice: its countdown is checked against ``ladder_max_delay`` when Celery builds
        the message, and the message is published a moment later. Each reading costs several ``conf.get``;
        the publish takes this one instead of reading again.
        """
        settings = self.get()
        self._held.reading = (task_id, time.monotonic(), settings)
        return settings

    def reading_for(self, task_id: Any) -> LadderSettings:
        """The reading :meth:`read_for` kept for ``task_id`` on this thread within the last :data:`HELD_FOR`
        seconds (taken: used once), or a new one (:meth:`get`)."""
        held = getattr(self._held, "reading", None)
        self._held.reading = None
        if held is not None and task_id is not None and held[0] == task_id \
                and time.monotonic() - held[1] <= HELD_FOR:
            return held[2]  # type: ignore[no-any-return]
        return self.get()
