"""The tests' result clients on Celery 5.6: its rpc result consumer must not reconnect on a polling timeout.

Celery 5.6's ``BaseResultConsumer.reconnect_on_error`` counts ``socket.timeout`` as a
connection error, and ``result.get`` polls with a one-second ``drain_events(timeout=...)``:
each quiet second the consumer is cancelled, its auto-delete reply queue goes with it,
and a result published before the new consumer declares it again is dropped. The task
ran; ``result.get`` times out (seen in CI's Celery 5.6 stack, under load, in
``test_pool_ladder_with_concurrency_and_queues_runs_delayed_tasks_on_time`` and the
Celery example's test, with the worker's log showing each task run on time). Celery
5.7 lets the timeout through (``except socket.timeout: raise`` in the same method);
:func:`apply` does that on older releases, for the test process's clients only. The
library itself never waits on results and is not patched.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Any, Iterator


def apply() -> bool:
    """Let a polling timeout through Celery's ``reconnect_on_error`` where it would reconnect; True if patched."""
    try:
        from celery.backends.asynchronous import BaseResultConsumer
    except ImportError:  # no Celery (a kombu-only run), or none with the method
        return False
    original = getattr(BaseResultConsumer, "reconnect_on_error", None)
    if original is None or getattr(original, "polling_timeout_passes", False) or not _swallows_timeouts():
        return False

    @contextmanager
    def reconnect_on_error(self: Any) -> Iterator[None]:
        try:
            yield
        except socket.timeout:
            raise  # a quiet poll, not a lost connection
        except BaseException:
            with original(self):
                raise

    reconnect_on_error.polling_timeout_passes = True  # type: ignore[attr-defined]
    BaseResultConsumer.reconnect_on_error = reconnect_on_error  # type: ignore[method-assign]
    return True


def _swallows_timeouts() -> bool:
    """Whether this Celery's ``reconnect_on_error`` turns a ``socket.timeout`` into a reconnect."""
    from celery.backends.asynchronous import BaseResultConsumer

    class Probe(BaseResultConsumer):  # type: ignore[misc]
        def __init__(self) -> None:
            self._connection_errors = (OSError,)
            self.reconnected = False

        def _reconnect(self) -> None:
            self.reconnected = True

    probe = Probe()
    try:
        with probe.reconnect_on_error():
            raise socket.timeout("poll")
    except socket.timeout:
        return False
    return probe.reconnected
