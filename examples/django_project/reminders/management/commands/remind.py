"""``python manage.py remind TEXT --countdown SECONDS``: send a reminder task for later."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from reminders.tasks import remind


class Command(BaseCommand):
    help = "Send the remind task with a countdown (it waits in the ladder when CELERY_LADDER_ENABLED)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("text")
        parser.add_argument("--countdown", type=float, default=60.0)

    def handle(self, *args: Any, text: str, countdown: float, **options: Any) -> None:
        result = remind.apply_async((text,), countdown=countdown)
        self.stdout.write(f"scheduled {result.id} in {countdown:g}s")
