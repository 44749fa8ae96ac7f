"""The tests' Celery result clients: a quiet poll is no lost connection, a lost connection still reconnects."""

from __future__ import annotations

import socket

import celery_rpc_polling
import pytest

asynchronous = pytest.importorskip("celery.backends.asynchronous")
if not hasattr(asynchronous.BaseResultConsumer, "reconnect_on_error"):
    pytest.skip("this Celery's result consumer never reconnects (before 5.6)", allow_module_level=True)


class Consumer(asynchronous.BaseResultConsumer):  # type: ignore[misc, name-defined]
    def __init__(self) -> None:
        self._connection_errors = (OSError,)
        self.reconnects = 0

    def _reconnect(self) -> None:
        self.reconnects += 1


def test_a_polling_timeout_passes_through_without_a_reconnect() -> None:
    celery_rpc_polling.apply()  # conftest applied it already: applying again changes nothing
    consumer = Consumer()
    with pytest.raises(socket.timeout):
        with consumer.reconnect_on_error():
            raise socket.timeout("a quiet second")
    assert consumer.reconnects == 0


def test_a_lost_connection_still_reconnects() -> None:
    consumer = Consumer()
    with consumer.reconnect_on_error():
        raise ConnectionResetError("gone")
    assert consumer.reconnects == 1


def test_other_errors_pass_through() -> None:
    consumer = Consumer()
    with pytest.raises(KeyError):
        with consumer.reconnect_on_error():
            raise KeyError("not a connection error")
    assert consumer.reconnects == 0
