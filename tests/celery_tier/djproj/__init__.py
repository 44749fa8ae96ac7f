"""A minimal Django project for the Celery-tier tests (Celery's Django layout)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
