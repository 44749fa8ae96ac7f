"""Helpers for fault tests: publish numbered messages, count what arrives, watch queue depths."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import quote

from helpers import drain, ladder_depth, rabbitmqctl, wait_until
from kombu import Connection, Consumer, Queue

from kombu_ladder import LadderProducer, Scheduler, declare
from kombu_ladder.contract import CONTROL

#: ``ladder_depth`` and ``wait_until`` live in tests/helpers.py; the fault tests import them from here too.
__all__ = ["Collector", "NodeControl", "Restartable", "free_port", "WorkerProcess", "publish_numbered",
           "random_delays", "ladder_depth", "control_counts", "run_figures", "take_figures", "wait_until",
           "wait_delivered", "declare_ladder"]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NodeControl:
    """What the fault suite's private node and the cluster suite's nodes share: ``rabbitmqctl -n``, boot, probes.

    A subclass has ``name`` (the Erlang node name), ``port`` (AMQP) and ``base`` (its data and log directory).
    """

    name: str
    port: int
    base: Path
    #: How long a boot may take.
    boot_timeout = 120.0

    def ctl(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """Run ``rabbitmqctl -n <this node> ...`` and return its output."""
        return rabbitmqctl(*args, node=self.name, timeout=timeout, check=check)

    def await_startup(self) -> None:
        """Wait for the node to boot; ``await_startup`` fails until the node registered."""
        deadline = time.monotonic() + self.boot_timeout
        while True:
            done = subprocess.run(["rabbitmqctl", "-q", "-n", self.name, "await_startup", "--timeout", "60"],
                                  capture_output=True, text=True, timeout=90)
            if done.returncode == 0 and self.reachable():
                self.booted()
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ node {self.name} did not start: {done.stderr}\n{self.log_tail()}")
            time.sleep(0.5)

    def booted(self) -> None:
        """Called once :meth:`await_startup` saw the node up."""

    def version(self) -> str:
        """The node's RabbitMQ release (``rabbitmqctl version``)."""
        return self.ctl("version").strip()

    def reachable(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def url(self, vhost: str, user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}/{quote(vhost, safe='')}"

    def log_tail(self, lines: int = 40) -> str:
        logs = sorted((self.base / "log").glob("*.log"))
        if not logs:
            return "(no node log)"
        return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])


class Collector:
    """Consume a target queue in a thread and count every delivery by message number."""

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.queue = queue
        self.seen: collections.Counter[int] = collections.Counter()
        self.last_at = time.monotonic()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"collect-{queue}", daemon=True)
        self.error: Optional[BaseException] = None

    def __enter__(self) -> "Collector":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the collector on {self.queue} did not start: {self.error!r}")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _on_message(self, body: Any, message: Any) -> None:
        self.seen[int(body["n"])] += 1
        self.last_at = time.monotonic()
        message.ack()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with Connection(self.url) as conn:
                    conn.ensure_connection(max_retries=200, interval_start=0.2, interval_step=0.2,
                                           interval_max=1)
                    queue = Queue(self.queue, durable=True)
                    with Consumer(conn, [queue], callbacks=[self._on_message], accept=["json"],
                                  prefetch_count=200):
                        self._ready.set()
                        while not self._stop.is_set():
                            try:
                                conn.drain_events(timeout=0.5)
                            except TimeoutError:
                                pass
            except Exception as exc:  # noqa: BLE001 - a broker restart: reconnect
                self.error = exc
                time.sleep(0.5)

    @property
    def unique(self) -> int:
        return len(self.seen)

    @property
    def total(self) -> int:
        return sum(self.seen.values())

    def figures(self, sent: int) -> dict[str, int]:
        """Return sent, delivered (distinct), duplicated (extra copies) and lost."""
        lost = sum(1 for n in range(sent) if n not in self.seen)
        return {"sent": sent, "delivered": self.unique, "duplicated": self.total - self.unique, "lost": lost}


class Confirms:
    """The broker's confirms of the publishes on one channel, put in confirm mode: waited for at the end, not
    one by one."""

    def __init__(self, channel: Any) -> None:
        self.acked: set[int] = set()
        self.upto = 0  # every tag up to here is acked
        self.nacked = 0
        channel.confirm_select()
        channel.events["basic_ack"].add(self._ack)
        channel.events["basic_nack"].add(self._nack)

    def _ack(self, tag: int, multiple: bool = False) -> None:
        if multiple:
            self.upto = max(self.upto, tag)
        else:
            self.acked.add(tag)
        while self.upto + 1 in self.acked:
            self.upto += 1
            self.acked.discard(self.upto)

    def _nack(self, tag: int, multiple: bool = False, requeue: bool = False) -> None:
        self.nacked += 1

    def wait(self, conn: Connection, count: int, timeout: float, where: str) -> None:
        """Wait (at most ``timeout`` seconds) until the first ``count`` publishes are confirmed; fail on a nack."""
        deadline = time.monotonic() + max(timeout, 1.0)
        while self.upto < count and not self.nacked and time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=1.0)
            except TimeoutError:
                pass
        assert not self.nacked, f"{where} refused {self.nacked} of the publishes waited for (basic.nack)"
        assert self.upto >= count, f"{where} confirmed {self.upto} of {count} publishes in time"


def publish_numbered(url: str, count: int, delays: Callable[[int], float], *, queue: str,
                     exchange: str = "", pipelined: bool = False) -> None:
    """Schedule ``count`` messages ``{"n": i}`` for ``queue``, each confirmed by the broker.

    ``pipelined``: not confirmed one by one (2,000 took 27 s on a machine loaded by CI), but all waited for
    at the end (:class:`Confirms`).
    """
    with Connection(url) as conn:
        if pipelined:
            channel = conn.channel()
            confirms = Confirms(channel)
            producer = LadderProducer(channel, serializer="json")
            for n in range(count):
                producer.publish({"n": n}, routing_key=queue, exchange=exchange, message_id=str(n),
                                 countdown=delays(n))
            confirms.wait(conn, count, 120.0, url)
            channel.close()
            return
        with Scheduler.on(conn, relay=False, serializer="json") as scheduler:
            for n in range(count):
                scheduler.in_(delays(n), {"n": n}, routing_key=queue, exchange=exchange, message_id=str(n))


def declare_ladder(url: str, target: str) -> None:
    """Declare the ladder and the durable target queue ``target`` on the broker at ``url``."""
    with Connection(url) as conn:
        declare(conn)
        Queue(target, durable=True)(conn.default_channel).declare()


def wait_delivered(collector: Collector, node: NodeControl, vhost: str, sent: int, timeout: float,
                   log: Callable[[], str]) -> dict[str, int]:
    """Wait until all ``sent`` messages have reached ``collector``, the ladder is empty and nothing has arrived
    for 1.5 s (so late duplicates are counted too); return the collector's figures."""
    def settled() -> bool:
        return (collector.unique == sent and ladder_depth(node.ctl, vhost) == 0
                and time.monotonic() - collector.last_at > 1.5)

    wait_until(settled, timeout, "every message delivered and the ladder empty",
               lambda: f"{collector.figures(sent)}\n{log()[-3000:]}")
    return collector.figures(sent)


def control_counts(node: NodeControl, vhost: str) -> tuple[int, int]:
    """(ready, unacked) messages in the control queue."""
    out = node.ctl("list_queues", "-p", vhost, "name", "messages_ready", "messages_unacknowledged",
                   "--no-table-headers")
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == CONTROL:
            return int(parts[1]), int(parts[2])
    return 0, 0


def random_delays(low: float, high: float, seed: int) -> Callable[[int], float]:
    rng = random.Random(seed)
    return lambda n: rng.uniform(low, high)


class Restartable:
    """A subprocess that a fault test starts, kills with SIGKILL and starts again; one log per start."""

    #: Seconds :meth:`stop` waits after SIGTERM before it kills.
    stop_timeout = 15.0

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0

    def log_path(self, start: int) -> Path:
        raise NotImplementedError

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return "\n".join(self.log_path(n).read_text(errors="replace") for n in range(1, self.starts + 1))


class WorkerProcess(Restartable):
    """A ``celery -A faultapp worker`` subprocess (threads pool) that records each task run in a file."""

    stop_timeout = 20.0

    def __init__(self, broker_url: str, workdir: Path, *, vanilla: bool = False, name: str = "w",
                 allowed: Optional[list[str]] = None, exclusive_control: bool = False,
                 acks_late: bool = False) -> None:
        self.broker_url = broker_url
        self.allowed = allowed
        self.exclusive_control = exclusive_control
        self.acks_late = acks_late
        self.workdir = workdir
        self.vanilla = vanilla
        self.name = name
        self.runs_file = workdir / f"{name}-runs.txt"
        self.runs_file.touch()
        super().__init__()

    def log_path(self, start: int) -> Path:
        return self.workdir / f"{self.name}-worker-{start}.log"

    def start(self, *, wait: bool = True) -> None:
        self.starts += 1
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, LADDER_FAULT_BROKER=self.broker_url, LADDER_FAULT_RUNS=str(self.runs_file),
                   LADDER_FAULT_VANILLA="1" if self.vanilla else "0",
                   LADDER_FAULT_ALLOWED="" if self.allowed is None else json.dumps(self.allowed),
                   LADDER_FAULT_EXCLUSIVE_CONTROL="1" if self.exclusive_control else "0",
                   LADDER_FAULT_ACKS_LATE="1" if self.acks_late else "0",
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).parent / "apps"), str(root)]))
        with open(self.log_path(self.starts), "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "faultapp", "worker", "-P", "threads", "-c", "8",
                 "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "-n", f"{self.name}-{uuid.uuid4().hex[:6]}@%h"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
            )
        if wait:
            wait_until(lambda: " ready." in self.log_path(self.starts).read_text(errors="replace")
                       or not self.alive(), 60, "the worker to be ready", self.log)
            assert self.alive(), self.log()

    def runs(self) -> collections.Counter[int]:
        """How many times each task number has run so far."""
        text = self.runs_file.read_text()
        return collections.Counter(int(line) for line in text.splitlines() if line.strip())


def run_figures(runs: collections.Counter[int], sent: int) -> dict[str, int]:
    """Sent, delivered (distinct task runs), duplicated (extra runs) and lost, from run counts."""
    lost = sum(1 for n in range(sent) if n not in runs)
    return {"sent": sent, "delivered": len(runs), "duplicated": sum(runs.values()) - len(runs), "lost": lost}


def take_figures(connection: Connection, queue: str, sent: int) -> dict[str, int]:
    """Take every message of ``queue`` (JSON bodies ``{"n": N}``) and count them as :func:`run_figures` does."""
    return run_figures(collections.Counter(json.loads(m.body)["n"] for m in drain(connection, queue)), sent)
