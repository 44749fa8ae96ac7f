"""LadderSettings: the ladder's Celery settings, one table read and validated in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from kombu_ladder.plan import HOLD_BYTES, HOLD_WINDOW, MAX_DELAY, check_hold_bytes, check_hold_window, check_max_delay
from kombu_ladder.relay import RelayOptions
from kombu_ladder.topology import QUEUE_TYPES

__all__ = [
    "LadderSettings", "Setting", "SETTINGS", "SettingsCache", "PUBLISH_SETTINGS", "django_name", "label",
    "as_bool", "as_exchanges", "as_metrics_port", "as_metrics_address", "as_max_delay", "as_hold_window",
    "as_hold_bytes", "as_queue_type",
]

#: Strings accepted for a boolean setting (environment variables and .env files give strings).
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def django_name(name: str) -> str:
    """The Django settings.py spelling of a setting (Celery's ``namespace="CELERY"``): ``CELERY_LADDER_...``."""
    return f"CELERY_{name.upper()}"


def label(name: str) -> str:
    """How an error names a setting: its app.conf name and its Django name."""
    return f"setting {name} ({django_name(name)} in Django settings)"


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
    """Read ``ladder_allowed_exchanges``: ``None`` (every exchange) or a collection of names.

    ``""`` in the collection stands for the default exchange.

    Raises:
        TypeError: a single string, or anything but a list/tuple/set of strings, naming the setting.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise TypeError(f"{label(name)} must be None or a list of exchange names "
                    f"(\"\" is the default exchange), not {value!r}")


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


def _seconds(value: Any, name: str, check: Callable[..., float]) -> float:
    """A number of seconds (a numeric string too), checked by ``check`` with the setting named."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{label(name)} must be a number of seconds, not {value!r}") from None
    return check(value, argument=label(name))


def as_max_delay(value: Any, name: str = "ladder_max_delay") -> float:
    """Read ``ladder_max_delay``: seconds (a number, a numeric string or a timedelta) above zero.

    Raises:
        ValueError: not a positive finite number of seconds, naming the setting.
        TypeError: not a number, string or timedelta, naming the setting.
    """
    return _seconds(value, name, check_max_delay)


def as_hold_window(value: Any, name: str = "ladder_hold_window") -> float:
    """Read ``ladder_hold_window``: seconds from 0 (off) to 600.

    Raises:
        ValueError: out of range, or a string that is not a number, naming the setting.
        TypeError: not a number, naming the setting.
    """
    return _seconds(value, name, check_hold_window)


def as_hold_bytes(value: Any, name: str = "ladder_hold_bytes") -> int:
    """Read ``ladder_hold_bytes``: a whole number of bytes from 1 to 64 GiB (digits in a string are read too).

    Raises:
        ValueError: anything else, naming the setting.
    """
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return check_hold_bytes(value, argument=label(name))


def as_queue_type(value: Any, name: str = "ladder_queue_type") -> str:
    """Read ``ladder_queue_type``: ``"classic"`` (the contract) or ``"quorum"`` (replicated).

    Surrounding blanks and case are forgiven (environment variables).

    Raises:
        ValueError: anything else, naming the setting.
    """
    if isinstance(value, str) and value.strip().lower() in QUEUE_TYPES:
        return value.strip().lower()
    raise ValueError(f"{label(name)} must be \"classic\" (the AceMQ contract, the default) or \"quorum\" "
                     f"(replicated quorum queues, off-contract), not {value!r}")


@dataclass(frozen=True)
class Setting:
    """One ``ladder_*`` setting: its app.conf name, its default and how a configured value is read."""

    #: The app.conf name (``ladder_enabled``); the LadderSettings field is the part after ``ladder_``.
    name: str
    #: The value when the setting is absent or None.
    default: Any
    #: Reads a configured value (never None), raising an error that names the setting.
    parse: Callable[[Any, str], Any]

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


#: Every ladder setting of a Celery app, in the order the configuration reference lists them.
SETTINGS: tuple[Setting, ...] = (
    Setting("ladder_enabled", True, as_bool),
    Setting("ladder_relay", True, as_bool),
    Setting("ladder_adopt", None, as_bool),
    Setting("ladder_hold_window", HOLD_WINDOW, as_hold_window),
    Setting("ladder_hold_bytes", HOLD_BYTES, as_hold_bytes),
    Setting("ladder_max_delay", float(MAX_DELAY), as_max_delay),
    Setting("ladder_queue_type", "classic", as_queue_type),
    Setting("ladder_allowed_exchanges", None, as_exchanges),
    Setting("ladder_index", False, as_bool),
    Setting("ladder_metrics_port", None, as_metrics_port),
    Setting("ladder_metrics_address", "127.0.0.1", as_metrics_address),
)

#: The settings an ETA publish reads: :class:`SettingsCache` reads them again on every publish.
PUBLISH_SETTINGS = ("ladder_enabled", "ladder_max_delay", "ladder_index")


@dataclass(frozen=True)
class LadderSettings:
    """The ladder's settings for one Celery app (see :data:`SETTINGS` and the configuration reference)."""

    #: Publish ``countdown``/``eta`` tasks into the ladder; False restores Celery's own path.
    enabled: bool = True
    #: Run the relay as a consumer bootstep in this app's workers.
    relay: bool = True
    #: Move ETA tasks sent without the ladder into it (workers); None: when the worker runs the relay.
    adopt: Optional[bool] = None
    #: Seconds below which the workers' relay holds a message and delivers it at its due time; 0: off.
    hold_window: float = HOLD_WINDOW
    #: Bytes of messages the workers' relay holds at most; over it, it takes no new messages for a while.
    hold_bytes: int = HOLD_BYTES
    #: The longest countdown/ETA accepted, in seconds; the relay parks a due time further ahead.
    max_delay: float = float(MAX_DELAY)
    #: The queue profile the relay and the producers declare: "classic" (the contract) or "quorum".
    queue_type: str = "classic"
    #: Target exchanges the workers' relay may deliver to; ``None`` (the default) allows every one.
    allowed_exchanges: Optional[frozenset[str]] = None
    #: Append an entry per ETA task to the ``ladder.index`` stream (``celery ladder waiting``).
    index: bool = False
    #: The port the workers' relay serves Prometheus metrics on; None (the default) serves none.
    metrics_port: Optional[int] = None
    #: The address ``metrics_port`` listens on.
    metrics_address: str = "127.0.0.1"

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> "LadderSettings":
        """Read every ``ladder_*`` setting of :data:`SETTINGS` from ``app.conf`` (or a plain mapping).

        A setting that is absent or ``None`` takes its default.

        Raises:
            ValueError: a setting has a bad value (a boolean that is not one, a port out of
                range, a delay that is not a positive number of seconds, a queue type that is
                neither "classic" nor "quorum"); the message names it and its Django name.
            TypeError: a setting has the wrong type (``ladder_allowed_exchanges`` not a list of
                names, ``ladder_metrics_address`` not a string, a delay not a number).
        """
        return cls(**{setting.field: setting.read(conf.get(setting.name)) for setting in SETTINGS})

    def runs_relay(self, pool: Any) -> bool:
        """Whether a worker with this ``pool`` runs the relay: ``-P ladder`` always, else ``relay``."""
        return bool(getattr(pool, "with_relay", False)) or self.relay

    def relay_options(self, **values: Any) -> RelayOptions:
        """The relay's options these settings give (a worker's, ``celery ladder relay``'s); ``values`` override
        them (a command line's)."""
        return RelayOptions.of(RelayOptions(allowed_exchanges=self.allowed_exchanges, max_delay=self.max_delay,
                                            hold_window=self.hold_window, hold_bytes=self.hold_bytes,
                                            queue_type=self.queue_type), **values)

    def adopts(self, *, relay_runs: bool) -> bool:
        """Whether a worker adopts ETA tasks sent without the ladder: ``adopt``, or by default
        when the worker runs the relay and ``enabled`` is true."""
        return self.adopt if self.adopt is not None else (relay_runs and self.enabled)


_MISSING = object()


class SettingsCache:
    """An app's :class:`LadderSettings`, read once and again only when a setting it watches changes.

    The publish path asks on every ETA task. Celery's ``conf.get`` tries each
    spelling of a name in each layer of the configuration and raises a
    ``KeyError`` for every miss: about 6 µs for a setting left at its default.
    Here the spellings are worked out once per configuration object (the
    layers and prefix of a configuration loaded late change in place), and
    every spelling of each watched setting is read in every layer with
    ``dict.get``: when any of those differs from the last reading, the settings
    are read again whole, with Celery's own lookup (whose order of spellings and
    layers differs between Celery releases). A change at run time
    (``app.conf.ladder_enabled = False``) thus applies to the next publish.

    Arguments:
        conf: returns the configuration (``lambda: app.conf``), or a mapping read with its own ``get``.
        watch: the names read on every :meth:`get`; :meth:`get` ``(everything=True)`` compares them all.
    """

    def __init__(self, conf: Callable[[], Any], *, watch: tuple[str, ...] = PUBLISH_SETTINGS) -> None:
        self._conf = conf
        #: The names read by :meth:`get`, and by ``get(everything=True)``.
        self._names = {False: tuple(watch), True: tuple(setting.name for setting in SETTINGS)}
        self._layout: Any = None  # (conf, maps, prefix): what the spellings below were worked out for
        self._spellings: dict[bool, tuple[Any, ...]] = {}
        self._raw: dict[bool, tuple[Any, ...]] = {}
        self._settings: Optional[LadderSettings] = None

    def get(self, *, everything: bool = False) -> LadderSettings:
        """The settings, read again if a watched setting (any, with ``everything``) changed.

        Raises:
            ValueError, TypeError: a setting has a bad value (see :meth:`LadderSettings.from_conf`).
        """
        conf = self._conf()
        raw = self._read(conf, everything)
        settings = self._settings
        if settings is None or raw != self._raw.get(everything):
            settings = LadderSettings.from_conf(conf)
            self._raw = {everything: raw, not everything: self._read(conf, not everything)}
            self._settings = settings
        return settings

    def _read(self, conf: Any, everything: bool) -> tuple[Any, ...]:
        """Every spelling of the names in every layer of ``conf`` (a mapping that is no Celery
        ``Settings``, or one not loaded yet: the names read with its ``get``)."""
        if not self._laid_out(conf):
            return tuple(conf.get(name) for name in self._names[everything])
        spellings = self._spellings.get(everything)
        if spellings is None:
            spellings = self._spellings[everything] = tuple(
                key for name in self._names[everything] for key in self._keys(conf, name))
        return tuple(mapping.get(key, _MISSING) for mapping in conf.maps for key in spellings)

    def _laid_out(self, conf: Any) -> bool:
        """Whether ``conf``'s layers are the dicts the spellings were worked out for (worked out again if not)."""
        maps = getattr(conf, "maps", None)
        layout = self._layout
        prefix = getattr(conf, "prefix", None)
        if layout is not None and layout[0] is conf and layout[1] is maps and layout[2] == prefix:
            return True
        # A layer that is not a dict yet is Celery's PendingConfiguration. Its get() loads the configuration
        # on Python <= 3.11 but answers the default without loading on 3.12+ (UserDict.get asks __contains__
        # first), and loading may bring a namespace (config_from_object(..., namespace="CELERY")), so other
        # spellings than those worked out now. Let conf.get load it; the spellings are worked out after.
        if (getattr(conf, "_to_keys", None) is None or getattr(conf, "key_t", _MISSING) is _MISSING
                or not isinstance(maps, list) or not all(isinstance(mapping, dict) for mapping in maps)):
            return False
        self._layout, self._spellings = (conf, maps, prefix), {}
        return True

    @staticmethod
    def _keys(conf: Any, name: str) -> tuple[Any, ...]:
        """Every spelling of ``name`` Celery's lookup tries."""
        key_t = conf.key_t
        # Celery 5.7's _to_keys lists the old-style spellings (conf._keys) too; 5.3-5.6's leaves them to __getitem__
        spellings = [*conf._to_keys(name), *(convert(name) for convert in (getattr(conf, "_keys", None) or ()))]
        return tuple(dict.fromkeys(key_t(k) if key_t is not None else k for k in spellings))
