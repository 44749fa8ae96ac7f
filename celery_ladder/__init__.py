"""celery_ladder: Celery's countdown/eta through the AceMQ ladder (filled in by the Celery issue)."""

from __future__ import annotations

__all__: list[str] = []
