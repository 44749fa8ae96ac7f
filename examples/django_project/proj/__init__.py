"""The example project: importing it makes its Celery app the current one."""

from .celery import app as celery_app

__all__ = ("celery_app",)
