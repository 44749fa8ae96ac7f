"""The relay: consume expired messages and deliver, hop or park each, acked after confirm."""

from __future__ import annotations

from .core import RelayCore
from .counters import AllowList, Counters
from .runner import Relay

__all__ = ["AllowList", "Counters", "Relay", "RelayCore"]
