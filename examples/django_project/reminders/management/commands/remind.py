"""``python manage.py remind TEXT --countdown SECONDS``: remind me later."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from reminders.tasks import remind


class Command(BaseCommand):
    help = "Send the remind task with a countdown (via the ladder if enabled)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("text")
        parser.add_argument("--countdown", type=float, default=60.0)

    def handle(self, *args: Any, text: str, countdown: float,
               **options: Any) -> None:
        result = remind.apply_async((text,), countdown=countdown)
        self.stdout.write(f"scheduled {result.id} in {countdown:g}s")
