"""Settings of the example project: the ladder is one app and one toggle."""

import os

SECRET_KEY = "example-only-not-secret"
DEBUG = True
USE_TZ = True
TIME_ZONE = "UTC"  # Django's default is America/Chicago, worker logs included
DATABASES: dict = {}

INSTALLED_APPS = [
    "reminders",
    "celery_ladder.django",  # installs the ladder on the project's Celery app
]

CELERY_BROKER_URL = os.environ.get("BROKER_URL",
                                   "amqp://guest:guest@localhost//")

# The toggle: True sends countdown/eta tasks through the ladder; False is
# Celery's own path. Strings such as "true"/"false" (from the environment)
# are accepted; any other value stops Django with a ValueError.
CELERY_LADDER_ENABLED = os.environ.get("LADDER_ENABLED", "true")
# Run the relay inside this project's workers (the default).
CELERY_LADDER_RELAY = True
# This project's own queue: a delayed task goes to whichever worker consumes
# its queue when it falls due, so projects on one broker should not share one.
CELERY_TASK_DEFAULT_QUEUE = "quickstart-django"
