"""A Django app with one Celery task."""
