"""The console's options, validated once (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .security import Auth, check_bind

__all__ = ["ConsoleOptions", "DEFAULT_HOST", "DEFAULT_PORT", "MIN_INTERVAL"]

#: Where the console listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8642
#: The shortest interval between two broker samples (depths, relay counters, index reads), in seconds: however
#: many people watch, the broker sees one sampler.
MIN_INTERVAL = 1.0


@dataclass(frozen=True)
class ConsoleOptions:
    """How the console runs.

    Raises:
        ValueError: naming the option at fault (a non-loopback host without credentials, an interval below
            :data:`MIN_INTERVAL`, a page size out of range).
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    auth: Auth = field(default_factory=Auth)
    #: No action at all: no buttons, no POST routes.
    read_only: bool = False
    #: Seconds between queue-depth samples, index reads and relay-counter polls.
    refresh: float = 5.0
    #: Rows per page of the waiting list.
    page_size: int = 50
    #: Messages looked at, at most, to show one message's headers and body (its queue is scanned).
    look_limit: int = 50_000
    #: Body bytes a preview shows at most.
    preview_bytes: int = 4096
    #: Parked messages the parked page shows at most.
    parked_limit: int = 500

    def __post_init__(self) -> None:
        check_bind(self.host, self.auth)
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"--port: {self.port!r} is not a port (0 to 65535)")
        if not self.refresh >= MIN_INTERVAL:
            raise ValueError(f"--refresh: {self.refresh!r} is below the minimum of {MIN_INTERVAL:g} s")
        for name, value, top in (("--page-size", self.page_size, 1000), ("--look-limit", self.look_limit, 10**7),
                                 ("--preview-bytes", self.preview_bytes, 1 << 20),
                                 ("--parked-limit", self.parked_limit, 100_000)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise ValueError(f"{name}: {value!r} is not a whole number from 1 to {top}")
