"""Per-message warnings, rate-limited (a few lines per kind and window, then a summary); the handlers' boundary."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from .link import CONNECTION_ERRORS

__all__ = ["Notices", "W_SUPPRESSED", "guarded"]

W_SUPPRESSED = "%d more %s warning(s) like the above in the last %.0f s (not logged one by one)"
E_HANDLER = "the relay failed while handling %s (it keeps running; the message(s) concerned stay unacked)"

F = TypeVar("F", bound=Callable[..., Any])


def guarded(what: str) -> Callable[[F], F]:
    """Keep any exception but a lost connection from leaving a broker callback: it is logged through the
    object's ``notices`` (a :class:`Notices`)."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except CONNECTION_ERRORS:
                raise
            except Exception:  # noqa: BLE001 - the boundary: a relay never dies of one message
                self.notices.warn("internal", E_HANDLER, what, level=logging.ERROR, exc_info=True)
                return None
        return wrapper  # type: ignore[return-value]

    return decorate


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
