"""Django integration: add ``'celery_ladder.django'`` to ``INSTALLED_APPS`` to install the ladder."""

from __future__ import annotations

__all__: list[str] = []
