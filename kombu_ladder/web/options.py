"""The console's options, validated once (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tuning import CONSOLE
from .security import Auth, check_bind

__all__ = ["ConsoleOptions", "DEFAULT_HOST", "DEFAULT_PORT", "MIN_INTERVAL"]

#: Where the console listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT: int = CONSOLE["port"].default
#: The shortest interval between two broker samples (depths, relay counters, index reads), in seconds: however
#: many people watch, the broker sees one sampler.
MIN_INTERVAL = CONSOLE["refresh"].least


@dataclass(frozen=True)
class ConsoleOptions:
    """How the console runs.

    Raises:
        ValueError: naming the option at fault (a non-loopback host without credentials, an interval below
            :data:`MIN_INTERVAL`, a page size out of range).
    """

    host: str = DEFAULT_HOST
    # The numbers: help, defaults and bounds in kombu_ladder.tuning.CONSOLE.
    port: int = CONSOLE["port"].default
    auth: Auth = field(default_factory=Auth)
    #: No action at all: no buttons, no POST routes.
    read_only: bool = False
    refresh: float = CONSOLE["refresh"].default
    page_size: int = CONSOLE["page_size"].default
    look_limit: int = CONSOLE["look_limit"].default
    preview_bytes: int = CONSOLE["preview_bytes"].default
    parked_limit: int = CONSOLE["parked_limit"].default

    def __post_init__(self) -> None:
        check_bind(self.host, self.auth)
        for name, tunable in CONSOLE.items():
            object.__setattr__(self, name, tunable.check(getattr(self, name), tunable.option))
