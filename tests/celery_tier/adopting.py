"""The adoption tests' worker process (``celery -A adoptapp worker -P ladder``) and what they read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

from celery.utils.time import maybe_iso8601
from helpers import drain, ladder_counters, wait_for, wait_for_counters
from kombu import Connection

from .adoptapp import ADOPT_QUEUE, runs

__all__ = ["AdoptWorker", "celery_cli", "lateness", "peek"]

HERE = Path(__file__).parent


def _env(broker_url: str, **extra: str) -> dict[str, str]:
    return dict(os.environ, LADDER_ADOPT_BROKER=broker_url, **extra,
                PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def celery_cli(broker_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A adoptapp ARGS`` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "celery", "-A", "adoptapp", *args], cwd=HERE,
                          env=_env(broker_url), capture_output=True, text=True, timeout=120)


class AdoptWorker:
    """``celery -A adoptapp worker -P ladder``: a plain app's worker, with the relay and adoption the pool brings."""

    def __init__(self, broker_url: str, workdir: Path) -> None:
        self.broker_url = broker_url
        self.workdir = workdir
        self.runs_file = workdir / "runs.jsonl"
        self.runs_file.touch()
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0
        self.hostname = ""

    def start(self, **env: str) -> None:
        self.starts += 1
        self.hostname = f"adopt-{uuid.uuid4().hex[:6]}@test"
        with open(self.workdir / f"worker-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "adoptapp", "worker", "-P", "ladder", "-c", "2",
                 "-Q", ADOPT_QUEUE, "-n", self.hostname, "-l", "info", "--without-gossip", "--without-mingle"],
                cwd=HERE, env=_env(self.broker_url, LADDER_ADOPT_RUNS=str(self.runs_file), **env),
                stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, app: Any) -> None:
        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            counters = ladder_counters(app, [self.hostname], timeout=1).get(self.hostname, {})
            return counters.get("relay") is True and counters.get("adopt") is True

        wait_for(ready, timeout=60, interval=0.5, message="the -P ladder worker, its relay and adoption")

    def counters(self, app: Any) -> dict[str, Any]:
        return wait_for_counters(app, [self.hostname], lambda c: True, "the worker's counters")[self.hostname]

    def kill9(self) -> None:
        """What ``kill -9`` does: the worker (its main process) ends at once, whatever it was doing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> "AdoptWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def runs(self) -> list[dict[str, Any]]:
        return runs(str(self.runs_file))

    def log(self) -> str:
        return "\n".join((self.workdir / f"worker-{n}.log").read_text(errors="replace")
                         for n in range(1, self.starts + 1))


def lateness(run: dict[str, Any]) -> float:
    return float(run["at"] - maybe_iso8601(run["eta"]).timestamp())


def peek(url: str, queue: str) -> list[Any]:
    """The messages of ``queue``, head first, each given back to its place."""
    with Connection(url) as conn:
        return drain(conn, queue, give_back=True)
