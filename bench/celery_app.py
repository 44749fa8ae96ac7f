"""The Celery apps the benchmarks drive: vanilla, with the ladder, or with Celery's native delayed delivery.

A worker runs ``celery -A bench.celery_app:app worker`` with ``LADDER_BENCH_MODE``,
``LADDER_BENCH_BROKER`` and ``LADDER_BENCH_OUT`` in its environment; the
benchmark process builds the same app with :func:`make_app`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any, Optional

from celery import Celery
from kombu import Exchange, Queue

from kombu_ladder.contract import CONTROL

from .common import Child, wait_until

__all__ = ["MODES", "QUEUE", "make_app", "Worker", "app"]

#: The contenders' Celery setups.
MODES = ("vanilla", "ladder", "native")

#: The task queue every mode uses.
QUEUE = "bench"


def make_app(mode: str, broker: str, out: str, *, relay: bool = True) -> Celery:
    """Return a Celery app for ``mode`` whose ``bench.record`` task appends ``i due_ms start_ms`` to ``out``.

    With ``relay=False`` a ladder worker runs no relay (``ladder_relay=False``): one runs elsewhere.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    app = Celery(f"ladder_bench_{mode}", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        enable_utc=True,
    )
    if mode == "native":
        # What native delayed delivery needs (NOTES.md): quorum queue, topic exchange, confirms.
        exchange = Exchange(QUEUE, type="topic")
        app.conf.update(
            task_queues=[Queue(QUEUE, exchange, routing_key=QUEUE, queue_arguments={"x-queue-type": "quorum"})],
            task_default_exchange=QUEUE,
            task_default_exchange_type="topic",
            task_default_routing_key=QUEUE,
            task_default_queue_type="quorum",
            broker_transport_options={"confirm_publish": True},
        )
    elif mode == "ladder":
        import celery_ladder

        celery_ladder.install(app)
        app.conf.ladder_relay = relay

    @app.task(name="bench.record", shared=False)
    def record(i: int, due_ms: float) -> None:
        started = time.time() * 1000
        with open(out, "a") as fh:
            fh.write(f"{i} {due_ms} {started:.3f}\n")

    return app


class Worker:
    """A ``celery worker`` child process for one mode, in the given vhost."""

    def __init__(self, url: str, mode: str, out: str, *, concurrency: int = 2, relay: bool = True,
                 pool: str = "prefork", name: Optional[str] = None) -> None:
        self.mode = mode
        self.log = tempfile.NamedTemporaryFile(prefix=f"ladder-bench-worker-{mode}-", suffix=".log", delete=False)
        argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app:app", "worker", "-P", pool,
                "-c", str(concurrency), "-Q", QUEUE, "-l", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", name or f"bench-{mode}-{os.getpid()}@%h"]
        env = {"LADDER_BENCH_MODE": mode, "LADDER_BENCH_BROKER": url, "LADDER_BENCH_OUT": out,
               "LADDER_BENCH_RELAY": "1" if relay else "0"}
        self.child = Child(argv, env=env, stdout=self.log, stderr=self.log)
        self.failed = False  #: keep the worker's log for a look when it failed

    @property
    def pid(self) -> int:
        """The worker's main process (the one that holds ETA tasks)."""
        return self.child.pid

    def wait_ready(self, connection: Any, timeout: float = 60) -> None:
        """Return once the worker consumes its queue (and, with the ladder, the control queue)."""
        def ready() -> bool:
            if self.child.proc.poll() is not None:
                self.failed = True
                raise RuntimeError(f"the {self.mode} worker exited; see {self.log.name}")
            try:
                if _consumers(connection, QUEUE) < 1:
                    return False
                if self.mode == "ladder" and _consumers(connection, CONTROL) < 1:
                    return False
                if self.mode == "native":
                    channel = connection.channel()
                    channel.exchange_declare("celery_delayed_27", "topic", passive=True)
                    _close(channel)
            except connection.channel_errors:
                return False
            return True

        if not wait_until(ready, timeout, interval=0.2):
            self.failed = True
            raise RuntimeError(f"the {self.mode} worker was not ready after {timeout:g}s; see {self.log.name}")
        time.sleep(1.0 if self.mode == "native" else 0.2)  # native binds its queues just after

    def stop(self) -> Optional[int]:
        """Stop the worker (its whole process group); remove its log unless it failed."""
        code = self.child.stop(timeout=15)
        self.log.close()
        if not self.failed and os.path.exists(self.log.name):
            os.unlink(self.log.name)
        return code

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _consumers(connection: Any, queue: str) -> int:
    channel = connection.channel()
    _, _, consumers = channel.queue_declare(queue, passive=True)
    _close(channel)
    return int(consumers)


def _close(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - already closed by the broker
        pass


#: The app a worker started with ``-A bench.celery_app:app`` runs.
app = make_app(
    os.environ.get("LADDER_BENCH_MODE", "vanilla"),
    os.environ.get("LADDER_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
    os.environ.get("LADDER_BENCH_OUT", os.devnull),
    relay=os.environ.get("LADDER_BENCH_RELAY", "1") != "0",
)
