"""celery.contrib.pytest's fixtures, as a user's suite has them: the embedded worker ladder_celery composes with.

pytest-celery loads them as a plugin, but from 1.0 on its own ``celery_worker`` (a Docker
container) takes that name; a suite that wants the embedded worker imports it, as here.
"""

from celery.contrib.pytest import (  # noqa: F401 - fixtures used by name
    celery_app,
    celery_config,
    celery_enable_logging,
    celery_includes,
    celery_parameters,
    celery_worker,
    celery_worker_parameters,
    celery_worker_pool,
    use_celery_app_trap,
)
