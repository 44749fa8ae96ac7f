"""Fault-test fixtures: a private RabbitMQ node for destructive tests, relay processes, figures."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from helpers import IN_CI, broker_reachable

from .faultkit import NodeControl, Restartable, free_port
from .figures_record import DATA, record

#: Where the figures of every fault test are written (``build/`` is git-ignored).
FIGURES_DIR = Path(__file__).resolve().parents[2] / "build"

_figures: list[dict[str, Any]] = []
#: The private node's RabbitMQ release, once it booted (printed with the figures).
_release: list[str] = []


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message + " (CI=true: fault tests must not skip)", pytrace=False)
    pytest.skip(message)


@dataclass
class PrivateNode(NodeControl):
    """A RabbitMQ node of this test session's own: restart it, stop it, change its settings."""

    name: str
    port: int
    dist_port: int
    base: Path
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        """Start the node (detached) and wait until it accepts connections."""
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, check=True,
                       capture_output=True, timeout=60)
        self.await_startup()

    def stop(self) -> None:
        """Stop the whole node (the Erlang VM too)."""
        self.ctl("stop", check=False)
        deadline = time.monotonic() + 30
        while self.reachable() and time.monotonic() < deadline:
            time.sleep(0.2)

    def restart(self) -> None:
        """A full broker restart: stop the node and boot it again on the same data."""
        self.stop()
        self.start()

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.await_startup()

    def set_consumer_timeout(self, millis: int) -> None:
        """Change ``consumer_timeout`` on this node only (never on the shared broker)."""
        self.ctl("eval", f"application:set_env(rabbit, consumer_timeout, {int(millis)}).")

    def new_vhost(self, prefix: str = "faults") -> str:
        """Create a vhost with full permissions for guest; return its name."""
        vhost = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.ctl("add_vhost", vhost)
        self.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        return vhost


def boot_private_node(prefix: str = "ladder-faults", config: str = "") -> PrivateNode:
    """Boot a RabbitMQ node of our own on free ports (``config``: more ``rabbitmq.conf`` lines); the caller
    stops it and removes its ``base`` (:func:`running_private_node` does both)."""
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        _unavailable("rabbitmq-server is not installed")
    if not broker_reachable():
        # The shared node runs epmd and owns the Erlang cookie the CLI uses.
        _unavailable("the shared RabbitMQ is not running, so no private node is started either")
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "rabbitmq":
        _unavailable("a private RabbitMQ node can only be started as root or as the rabbitmq user")
    base = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    name = f"{prefix}-{os.getpid()}@localhost"
    port, dist_port = free_port(), free_port()
    (base / "enabled_plugins").write_text("[].\n")
    # Our own config file: the system one pins the listener to :5672.
    (base / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{port}\n{config}")
    if os.geteuid() == 0:
        for path in [base, *base.iterdir()]:
            shutil.chown(path, "rabbitmq", "rabbitmq")
    env = dict(
        os.environ,
        RABBITMQ_NODENAME=name,
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(dist_port),
        RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
        RABBITMQ_LOG_BASE=str(base / "log"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
        RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
        RABBITMQ_PID_FILE=str(base / "node.pid"),
    )
    node = PrivateNode(name=name, port=port, dist_port=dist_port, base=base, env=env)
    try:
        node.start()
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return node


@contextlib.contextmanager
def running_private_node(prefix: str = "ladder-faults", config: str = "") -> Iterator[PrivateNode]:
    """A node of :func:`boot_private_node`'s, stopped and its ``base`` removed on leaving."""
    node = boot_private_node(prefix, config)
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(node.base, ignore_errors=True)


@pytest.fixture(scope="session")
def private_node() -> Iterator[PrivateNode]:
    """Boot a second RabbitMQ node on free ports for destructive tests; stop it at the end.

    The shared broker at :5672 is never restarted or reconfigured: restarts,
    ``stop_app`` and ``consumer_timeout`` changes all go to this node.
    """
    with running_private_node() as node:
        _release.append(node.version())
        yield node


@pytest.fixture
def fault_vhost(private_node: PrivateNode) -> Iterator[str]:
    """A fresh vhost on the private node, deleted after the test."""
    vhost = private_node.new_vhost()
    try:
        yield vhost
    finally:
        if private_node.reachable():
            private_node.ctl("delete_vhost", vhost, check=False)


@pytest.fixture
def fault_url(private_node: PrivateNode, fault_vhost: str) -> str:
    """The AMQP URL of the test's vhost on the private node."""
    return private_node.url(fault_vhost)


class RelayProcess(Restartable):
    """A standalone ``python -m kombu_ladder relay`` subprocess that can be killed and restarted."""

    def __init__(self, broker_url: str, logdir: Path, *extra: str) -> None:
        super().__init__()
        self.broker_url = broker_url
        self.logdir = logdir
        self.extra = extra

    def log_path(self, start: int) -> Path:
        return self.logdir / f"relay-{start}.log"

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_path(self.starts), "wb")  # noqa: SIM115 - the process owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kombu_ladder", "--log-level", "INFO", "--broker", self.broker_url,
             "relay", "--report-every", "2", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
        )
        log.close()


@pytest.fixture
def relay_process(fault_url: str, tmp_path: Path) -> Iterator[RelayProcess]:
    """A standalone relay on the test's vhost of the private node (not started yet)."""
    relay = RelayProcess(fault_url, tmp_path)
    try:
        yield relay
    finally:
        relay.stop()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict a fault test fills with its figures (sent, delivered, duplicated, lost, ...).

    The figures are printed and written to ``build/fault-figures.json`` and
    ``build/fault-figures.txt`` at the end of the session; those of the tests that passed are
    merged into ``docs/_data/fault-figures.json``, which the guarantees page's table shows.
    """
    figures: dict[str, Any] = {}
    yield figures
    if figures:
        entry = {"test": request.node.nodeid, **figures}
        _figures.append(entry)
        print(f"\nFIGURES {json.dumps(entry)}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _figures:
        return
    FIGURES_DIR.mkdir(exist_ok=True)
    (FIGURES_DIR / "fault-figures.json").write_text(json.dumps(_figures, indent=2) + "\n")
    lines = [f"broker: RabbitMQ {', '.join(sorted(set(_release))) or 'unknown'} (private node)"]
    for entry in _figures:
        rest = ", ".join(f"{k}={v}" for k, v in entry.items() if k != "test")
        lines.append(f"{entry['test'].split('::')[-1]}: {rest}")
    (FIGURES_DIR / "fault-figures.txt").write_text("\n".join(lines) + "\n")
    passed = {r.nodeid for r in terminalreporter.stats.get("passed", []) if getattr(r, "when", "") == "call"}
    lines.append(record(_figures, passed, ", ".join(sorted(set(_release))), DATA))
    terminalreporter.section("fault figures")
    for line in lines:
        terminalreporter.write_line(line)
