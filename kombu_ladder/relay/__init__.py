"""The relay: consume expired messages and deliver, hop, hold or park each, acked after confirm."""

from __future__ import annotations

from .core import RelayCore
from .counters import AllowList, Counters
from .driver import Relay
from .options import RelayOptions

__all__ = ["AllowList", "Counters", "Relay", "RelayCore", "RelayOptions"]
