"""The reminders app's tasks."""

from celery import shared_task


@shared_task
def remind(text: str) -> str:
    """Return the reminder; runs when it is due."""
    return f"reminded: {text}"
