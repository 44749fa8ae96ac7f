"""The ladder's benchmark harness: ``python -m bench`` (``make bench`` / ``make bench-quick``)."""

from __future__ import annotations

__all__: list[str] = []
