"""Times and durations as a user types them (command lines, console, index queries, settings): one grammar, pure."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Union

__all__ = ["TIME_HELP", "DURATION_HELP", "read_time", "read_duration", "parse_when"]

#: How every help text and error describes a time.
TIME_HELP = ("seconds from now (90, -30; 0 is now), a duration from now (+10m, -30s, 2h30m, 1d), or an ISO 8601 "
             "time (2026-12-24T17:00Z, 2026-12-24T18:00+01:00; UTC when it gives no offset)")
#: How every help text and error describes a duration.
DURATION_HELP = "seconds (90, 0.5) or a duration (10m, 2h30m, 1d)"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER = r"\d+(?:\.\d+)?"
_RELATIVE = re.compile(rf"^([+-]?)\s*(?:({_NUMBER})|((?:{_NUMBER}[smhd])+))$")
_PART = re.compile(rf"({_NUMBER})([smhd])")


def _seconds(sign: str, bare: str, parts: str) -> float:
    seconds = float(bare) if bare else sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(parts))
    return -seconds if sign == "-" else seconds


def read_duration(text: str, *, argument: str = "duration") -> float:
    """Seconds from ``text``: seconds (``90``, ``0.5``) or a duration (``10m``, ``2h30m``, ``1d``); no sign.

    Raises:
        ValueError: anything else (a sign, a unit other than s/m/h/d, not finite), naming ``argument``.
    """
    found = _RELATIVE.match(text.strip()) if isinstance(text, str) else None
    if found is None or found.group(1):
        raise ValueError(f"{argument}: {text!r} is not a duration: {DURATION_HELP}")
    seconds = _seconds("", found.group(2), found.group(3))
    if not math.isfinite(seconds):
        raise ValueError(f"{argument}: {text!r} is not a finite number of seconds")
    return seconds


def read_time(text: str, *, argument: str = "time") -> Union[float, datetime]:
    """What a typed time names: seconds from now (a float; ``+10m``, ``-30``, ``2h30m``), or an aware datetime
    (ISO 8601; a time without an offset is UTC).

    Raises:
        ValueError: neither, naming ``argument``.
    """
    stripped = text.strip() if isinstance(text, str) else ""
    found = _RELATIVE.match(stripped)
    if found is not None:
        seconds = _seconds(*found.groups(""))
        if math.isfinite(seconds):
            return seconds
    elif stripped[:4].isdigit():
        try:
            moment = datetime.fromisoformat(stripped[:-1] + "+00:00" if stripped.endswith(("Z", "z")) else stripped)
        except ValueError:
            pass
        else:
            return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
    raise ValueError(f"{argument}: {text!r} is not a time: {TIME_HELP}")


def parse_when(text: str, *, option: str, now_ms: int) -> int:
    """Epoch ms of a typed time (see :func:`read_time`), relative ones from ``now_ms``.

    Raises:
        ValueError: not a time, naming ``option``.
    """
    moment = read_time(text, argument=option)
    if isinstance(moment, float):
        return now_ms + round(moment * 1000)
    return round(moment.timestamp() * 1000)
