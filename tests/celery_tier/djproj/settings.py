"""Minimal Django settings: the ladder comes in through INSTALLED_APPS alone."""

import os

SECRET_KEY = "celery-ladder-tests"
USE_TZ = True
INSTALLED_APPS = ["celery_ladder.django"]
DATABASES: dict = {}

CELERY_BROKER_URL = os.environ["LADDER_TEST_BROKER_URL"]
CELERY_TASK_DEFAULT_QUEUE = "django-tasks"

#: The toggles under test; the test passes them through the environment (True/False or a bad value).
_values = {"True": True, "False": False}
if "LADDER_ENABLED" in os.environ:
    CELERY_LADDER_ENABLED = _values.get(os.environ["LADDER_ENABLED"], os.environ["LADDER_ENABLED"])
if "LADDER_RELAY" in os.environ:
    CELERY_LADDER_RELAY = _values.get(os.environ["LADDER_RELAY"], os.environ["LADDER_RELAY"])
