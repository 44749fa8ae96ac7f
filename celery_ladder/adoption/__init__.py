"""Adoption: ETA tasks sent without the ladder, moved into it by workers and by ``celery ladder adopt``."""

from __future__ import annotations

from .records import ADOPTED_HEADER, STREAM
from .worker import COUNTS, adoption_counts

__all__ = ["ADOPTED_HEADER", "STREAM", "COUNTS", "adoption_counts"]
