"""Per-message warnings, rate-limited: a few lines per kind and window, then one summary."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Notices", "W_SUPPRESSED"]

W_SUPPRESSED = "%d more %s warning(s) like the above in the last %.0f s (not logged one by one)"


@dataclass
class _Window:
    start: float
    logged: int = 0
    suppressed: int = 0


class Notices:
    """Log at most ``burst`` warnings of one kind per ``window`` seconds; count the rest.

    A storm of 20,000 malformed messages then costs a handful of lines plus one
    summary per window, instead of 20,000 lines that slow the relay down and
    bury everything else. :meth:`flush` (called on every relay tick) writes the
    summary of a window that has ended.
    """

    def __init__(self, logger: logging.Logger, *, window: float = 10.0, burst: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.window = window
        self.burst = burst
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def warn(self, kind: str, message: str, *args: Any, level: int = logging.WARNING,
             exc_info: bool = False) -> None:
        """Log ``message % args`` unless ``kind`` already had ``burst`` lines in this window."""
        now = self._clock()
        window = self._windows.get(kind)
        if window is not None and now - window.start >= self.window:
            self._summarise(kind, window)
            window = None
        if window is None:
            window = self._windows[kind] = _Window(now)
        if window.logged < self.burst:
            window.logged += 1
            self.logger.log(level, message, *args, exc_info=exc_info)
        else:
            window.suppressed += 1

    def flush(self) -> None:
        """Summarise and close every window that has ended."""
        now = self._clock()
        for kind, window in list(self._windows.items()):
            if now - window.start >= self.window:
                self._summarise(kind, window)
                del self._windows[kind]

    def _summarise(self, kind: str, window: _Window) -> None:
        if window.suppressed:
            self.logger.warning(W_SUPPRESSED, window.suppressed, kind, self.window)
