"""Shared benchmark plumbing: private vhosts, child processes, progress bars and statistics."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence
from urllib.parse import quote

from kombu import Connection

__all__ = [
    "HOST",
    "PORT",
    "ROOT",
    "PUBLISHER_OPTIONS",
    "Broker",
    "Vhost",
    "Child",
    "Progress",
    "Config",
    "rabbitmqctl",
    "queue_counts",
    "queue_depth",
    "summarize",
    "percentile",
    "median",
    "ms",
    "wait_until",
    "log",
    "payload",
]

#: Broker host and port (the shared RabbitMQ; every benchmark uses a vhost of its own).
HOST = os.environ.get("LADDER_BENCH_HOST", "127.0.0.1")
PORT = int(os.environ.get("LADDER_BENCH_PORT", "5672"))

#: The repository root: child processes run from here so ``bench`` is importable.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Transport options of the benchmarks' own fast publishers. py-amqp closes a connection whose sent bytes
#: stay unacknowledged for a second (``TCP_USER_TIMEOUT`` 1000 ms, its default), which a broker that
#: throttles a fast publisher (credit flow) on a loaded machine does: "basic_publish: timed out". A
#: publisher of the harness waits a minute instead; the relays keep py-amqp's default.
PUBLISHER_OPTIONS: dict[str, Any] = {"socket_settings": {getattr(socket, "TCP_USER_TIMEOUT", 18): 60_000}}

#: Vhosts created by this process and not yet deleted, with the rabbitmqctl of their node (cleaned at exit,
#: even on Ctrl-C).
_live_vhosts: dict[str, str] = {}


@dataclass(frozen=True)
class Config:
    """Sizes of one run: ``Config.full()`` for ``make bench``, ``Config.quick()`` for ``make bench-quick``."""

    name: str
    kombu_n: int  #: messages per kombu lateness contender
    celery_n: int  #: tasks per Celery lateness contender
    max_delay: float  #: delays are uniform in [1, max_delay] seconds
    lateness_grace: float  #: how long past the last due time a contender may take
    footprint_n: int  #: countdown=3600 tasks behind the plain one
    footprint_wait: float  #: bound on the wait for the plain task
    relay_n: int  #: messages per relay-throughput round
    publish_n: int  #: messages per publish-overhead round
    scale_waiting: int  #: messages left waiting in the 1h rung
    scale_due: int  #: messages falling due at once
    repeats: int  #: rounds per publish measurement (medians are reported)
    relay_repeats: int  #: paired raw/ours relay rounds (the median ratio is reported)
    burst_n: int = 1000  #: messages of the kombu burst, all due within the same second
    burst_lead: float = 20.0  #: seconds from publishing to that second (through the 10 s rung, then held)
    bursts_n: int = 10_000  #: messages per round of the bursts section, all due in the same second
    waiting_n: int = 100_000  #: messages waiting on one node in the waiting section, then due at once
    index_n: int = 100_000  #: entries in ladder.index for the index section's find/list/count latencies
    web_n: int = 100_000  #: entries in ladder.index behind the web console's pages
    web_look_n: int = 10_000  #: real messages in the 1h rung, the last of which a message's page looks for

    @classmethod
    def full(cls) -> "Config":
        """The full run's sizes: large enough that the tails of the distributions show."""
        return cls("full", 2000, 500, 75.0, 60.0, 20_000, 90.0, 5_000, 3_000, 100_000, 100_000, 5, 5, 1000, 20.0,
                   50_000, 1_000_000, index_n=1_000_000, web_look_n=100_000)

    @classmethod
    def quick(cls) -> "Config":
        """A reduced run that finishes in a few minutes."""
        return cls("quick", 300, 100, 25.0, 20.0, 2_000, 20.0, 3_000, 2_000, 10_000, 10_000, 3, 3, 500, 20.0,
                   10_000, 100_000)


def log(message: str) -> None:
    """Print a progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rabbitmqctl(*args: str, timeout: float = 120, ctl: str = "rabbitmqctl") -> str:
    """Run ``rabbitmqctl -q ARGS`` (``ctl`` names another node's) and return its standard output."""
    done = subprocess.run([ctl, "-q", *args], check=True, capture_output=True, text=True, timeout=timeout)
    return done.stdout


@dataclass(frozen=True)
class Broker:
    """A RabbitMQ node to benchmark on: where it listens and the ``rabbitmqctl`` that manages it."""

    name: str  #: how the page names it ("3.10", "4.0")
    host: str = HOST
    port: int = PORT
    ctl: str = "rabbitmqctl"  #: the command that manages it (a path, or a name on PATH)

    def rabbitmqctl(self, *args: str, timeout: float = 120) -> str:
        """Run this node's ``rabbitmqctl -q ARGS`` and return its standard output."""
        return rabbitmqctl(*args, timeout=timeout, ctl=self.ctl)


def _delete_vhost(name: str) -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave it behind
    try:
        subprocess.run([_live_vhosts.get(name, "rabbitmqctl"), "-q", "delete_vhost", name], capture_output=True,
                       timeout=300)
    finally:
        signal.signal(signal.SIGINT, previous)
        _live_vhosts.pop(name, None)


@atexit.register
def _cleanup_vhosts() -> None:
    for name in list(_live_vhosts):
        _delete_vhost(name)


class Vhost:
    """A RabbitMQ vhost of one benchmark's own, deleted on exit (also on Ctrl-C); on ``broker``'s node
    when one is given, else on the shared broker at ``HOST:PORT``."""

    def __init__(self, label: str, broker: Optional[Broker] = None) -> None:
        self.name = f"ladder-bench-{label}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.broker = broker if broker is not None else Broker("default")

    @property
    def url(self) -> str:
        """The AMQP URL of this vhost."""
        return f"amqp://guest:guest@{self.broker.host}:{self.broker.port}/{quote(self.name, safe='')}"

    def connection(self, **kwargs: Any) -> Connection:
        """A new kombu connection to this vhost."""
        return Connection(self.url, **kwargs)

    def __enter__(self) -> "Vhost":
        _live_vhosts[self.name] = self.broker.ctl
        self.broker.rabbitmqctl("add_vhost", self.name)
        self.broker.rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        return self

    def __exit__(self, *exc: Any) -> None:
        _delete_vhost(self.name)


def queue_counts(vhost: str, columns: Sequence[str] = ("messages", "messages_unacknowledged"),
                 ctl: str = "rabbitmqctl") -> dict[str, list[int]]:
    """Return ``{queue: [column values]}`` for every queue of ``vhost`` (from ``rabbitmqctl list_queues``)."""
    out = rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name", *columns, ctl=ctl)
    rows: dict[str, list[int]] = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == len(columns) + 1:
            rows[parts[0]] = [int(p) if p.strip().lstrip("-").isdigit() else 0 for p in parts[1:]]
    return rows


def queue_depth(connection: Connection, name: str) -> tuple[int, int]:
    """Return ``(messages ready, consumers)`` of queue ``name`` (passive declare)."""
    channel = connection.channel()
    try:
        _, messages, consumers = channel.queue_declare(name, passive=True)
        return messages, consumers
    finally:
        channel.close()


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """Poll ``condition`` until truthy or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


class Child:
    """A child process in a session of its own, ended (SIGTERM, then SIGKILL) with its whole group."""

    def __init__(self, argv: Sequence[str], *, env: Optional[dict[str, str]] = None, stdin: Any = None,
                 stdout: Any = None, stderr: Any = None) -> None:
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(list(argv), cwd=ROOT, env=full_env, stdin=stdin, stdout=stdout,
                                     stderr=stderr, start_new_session=True, text=True)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> Optional[int]:
        """Signal the child's process group and wait; kill it if it does not exit in time."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            except ProcessLookupError:
                pass
        try:  # stray grandchildren (prefork pool processes) of the same group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.proc.returncode

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def rss_kb(pid: int) -> int:
    """Return the resident set size of process ``pid`` in KiB (from /proc)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


__all__.append("rss_kb")


class Progress:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int, label: str, width: int = 30) -> None:
        self.total = max(total, 1)
        self.label = label
        self.width = width
        self.done = 0
        self.started = time.monotonic()
        self._drawn = 0.0
        self._tty = sys.stderr.isatty()
        self._last_decile = -1

    def update(self, done: int, note: str = "") -> None:
        """Show ``done`` out of the total."""
        self.done = done
        now = time.monotonic()
        if self._tty:
            if now - self._drawn < 0.1 and done < self.total:
                return
            self._drawn = now
            filled = int(self.width * min(done, self.total) / self.total)
            bar = "#" * filled + "." * (self.width - filled)
            sys.stderr.write(f"\r  {self.label} [{bar}] {done}/{self.total} {now - self.started:5.0f}s {note}\x1b[K")
            sys.stderr.flush()
        else:
            decile = int(10 * min(done, self.total) / self.total)
            if decile != self._last_decile:
                self._last_decile = decile
                log(f"  {self.label}: {done}/{self.total} after {now - self.started:.0f}s {note}")

    def close(self, note: str = "") -> None:
        """Finish the bar's line."""
        self._drawn = 0.0
        self.update(self.done, note)
        if self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """Return the ``q``-th percentile (0-100) of ``values``, linearly interpolated."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    """Return the median of ``values``."""
    return percentile(list(values), 50)


def ms(value: Optional[float]) -> str:
    """Format milliseconds: one decimal below 100 ms, thousands separators above."""
    if value is None:
        return "–"
    if abs(value) < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def summarize(lateness_ms: Sequence[float], expected: int) -> dict[str, Any]:
    """Summarize lateness (arrival minus due, in ms) of the messages that arrived out of ``expected``."""
    return {
        "expected": expected,
        "arrived": len(lateness_ms),
        "min": min(lateness_ms) if lateness_ms else None,
        "p50": percentile(lateness_ms, 50) if lateness_ms else None,
        "p99": percentile(lateness_ms, 99) if lateness_ms else None,
        "max": max(lateness_ms) if lateness_ms else None,
        "early": sum(1 for v in lateness_ms if v < 0),
        "late_1s": sum(1 for v in lateness_ms if v > 1000),
        "late_50ms": sum(1 for v in lateness_ms if v > 50),
    }


def payload(i: int, due_ms: int, size: int = 600) -> bytes:
    """A JSON body of about ``size`` bytes carrying the message's index and due time."""
    head = {"i": i, "due": due_ms, "pad": ""}
    pad = max(0, size - len(json.dumps(head)))
    head["pad"] = "x" * pad
    return json.dumps(head).encode()


def iter_lines(path: str) -> Iterator[str]:
    """Yield the lines of ``path`` (none when it does not exist yet)."""
    if not os.path.exists(path):
        return
    with open(path) as fh:
        yield from fh


__all__.append("iter_lines")
