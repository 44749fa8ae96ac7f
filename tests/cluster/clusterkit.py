"""A private three-node RabbitMQ cluster on loopback, for the cluster tests; relays as subprocesses.

Each node has its own node name, AMQP and distribution ports, data and log
directories; they share the Erlang cookie of the user RabbitMQ runs as (the
CLI and the shared broker's), as the fault suite's private node does. The
shared broker on :5672 is never touched: every ``rabbitmqctl`` call names a
node of this cluster with ``-n``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Optional

from faults.faultkit import NodeControl, Restartable, free_port, wait_until

__all__ = ["BOOT_TIMEOUT", "Cluster", "ClusterNode", "RelayProcess", "free_port"]

#: How long one node may take to boot (three share two cores with other work).
BOOT_TIMEOUT = 180.0


class ClusterNode(NodeControl):
    """One node of the private cluster."""

    boot_timeout = BOOT_TIMEOUT

    def __init__(self, name: str, base: Path) -> None:
        self.name = name
        self.base = base
        self.port, self.dist_port = free_port(), free_port()
        #: The node's Erlang VM, once it booted.
        self.vm_pid: Optional[int] = None
        base.mkdir(parents=True)
        (base / "enabled_plugins").write_text("[].\n")
        # Our own config file (the system one pins the listener to :5672); loopback only.
        (base / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
                                            "cluster_partition_handling = pause_minority\n")
        if os.geteuid() == 0:
            for path in [base, *base.iterdir()]:
                shutil.chown(path, "rabbitmq", "rabbitmq")
        self.env = dict(
            os.environ, RABBITMQ_NODENAME=name, RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"), RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"), RABBITMQ_PID_FILE=str(base / "node.pid"),
        )

    def start(self) -> None:
        """Start the node (detached); :meth:`await_startup` waits for it."""
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, check=True, capture_output=True, timeout=60)

    def booted(self) -> None:
        # Kept: RabbitMQ deletes its pid file when the app stops (pause_minority does too).
        self.vm_pid = int((self.base / "node.pid").read_text().strip())

    def stop(self) -> None:
        """Stop the node cleanly (the Erlang VM too), waiting until its port closes."""
        self.ctl("stop", check=False)
        wait_until(lambda: not self.reachable(), 60, f"{self.name} to stop")

    def kill9(self) -> None:
        """SIGKILL the node's Erlang VM: no goodbye to its peers or clients."""
        assert self.vm_pid is not None, f"{self.name} never booted"
        os.kill(self.vm_pid, signal.SIGKILL)
        wait_until(lambda: not self.reachable(), 30, f"{self.name} to die")


#: LADDER_CLUSTER_KHEPRI=1: the cluster keeps its metadata in Khepri (RabbitMQ 4.x's ``khepri_db``
#: feature flag) instead of Mnesia.
KHEPRI = os.environ.get("LADDER_CLUSTER_KHEPRI", "") in ("1", "true", "yes")


class Cluster:
    """Three nodes joined into one cluster; ``with Cluster() as cluster:`` boots it and tears it down."""

    #: The nodes' RabbitMQ release and metadata store, once booted.
    release = "unknown"
    metadata_store = "mnesia"

    def __init__(self, size: int = 3) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="ladder-cluster-"))
        if os.geteuid() == 0:
            shutil.chown(self.base, "rabbitmq", "rabbitmq")  # the nodes run as rabbitmq
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.nodes = [ClusterNode(f"ladder-c{i}-{tag}@localhost", self.base / f"n{i}") for i in range(1, size + 1)]

    def __enter__(self) -> "Cluster":
        try:
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                node.await_startup()
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first.name)
                node.ctl("start_app")
                node.await_startup()
            wait_until(lambda: self.running() == {n.name for n in self.nodes}, 60, "all three nodes running")
            khepri = self.khepri()
            if KHEPRI and not khepri:
                # RabbitMQ 4.0 ships Khepri as an experimental metadata store: once enabled on a
                # cluster it cannot be disabled, so only a private cluster ever gets it.
                first.ctl("enable_feature_flag", "--experimental", "khepri_db")
                khepri = self.khepri()
            self.release = first.version()
            # 4.3 has no other store (khepri_db is enabled on every fresh node): what the flag says, not the wish.
            self.metadata_store = "khepri" if khepri else "mnesia"
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def khepri(self) -> bool:
        """Whether the cluster keeps its metadata in Khepri (the ``khepri_db`` feature flag is enabled)."""
        rows = self.nodes[0].ctl("list_feature_flags", "--silent", "name", "state").split("\n")
        return any(row.split() == ["khepri_db", "enabled"] for row in rows)

    def teardown(self) -> None:
        """Stop every node, reachable or not: a node paused in a minority (pause_minority) closes its
        AMQP port but keeps its Erlang VM running; kill whatever VM is left."""
        for node in self.nodes:
            if node.vm_pid is not None and Path(f"/proc/{node.vm_pid}").exists():
                node.ctl("stop", check=False, timeout=60)
        for node in self.nodes:
            if node.vm_pid is not None and Path(f"/proc/{node.vm_pid}").exists():
                try:
                    os.kill(node.vm_pid, signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(self.base, ignore_errors=True)

    def running(self) -> set[str]:
        """The nodes the first reachable node reports running."""
        import json

        for node in self.nodes:
            if node.reachable():
                out = node.ctl("cluster_status", "--formatter", "json", check=False)
                try:
                    return set(json.loads(out)["running_nodes"])
                except (ValueError, KeyError):
                    return set()
        return set()

    def any_ctl(self, *args: str) -> str:
        """``rabbitmqctl`` on the first reachable node."""
        for node in self.nodes:
            if node.reachable():
                return node.ctl(*args)
        raise RuntimeError("no cluster node is reachable")

    def new_vhost(self) -> str:
        vhost = f"cluster-{uuid.uuid4().hex[:8]}"
        self.any_ctl("add_vhost", vhost)
        self.any_ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        return vhost

    def failover_url(self, vhost: str, first: int) -> str:
        """Node ``first``'s URL, then the others', as kombu's ``;``-separated failover list."""
        order = self.nodes[first:] + self.nodes[:first]
        return ";".join(node.url(vhost) for node in order)

    def home_of(self, vhost: str, queue: str) -> Optional[str]:
        """The node a classic queue lives on, or a quorum queue's leader."""
        out = self.any_ctl("list_queues", "-p", vhost, "name", "type", "pid", "leader", "--no-table-headers")
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0] == queue:
                if parts[1] == "quorum":
                    return parts[3]
                return parts[2].strip("<>").rsplit(".", 3)[0]  # a pid: <node.N.M.K>
        return None

    def node_named(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.name == name)


class RelayProcess(Restartable):
    """A ``python -m kombu_ladder relay`` subprocess on a (failover) broker URL."""

    def __init__(self, broker_url: str, logdir: Path, name: str, *extra: str) -> None:
        super().__init__()
        self.broker_url = broker_url
        self.logdir = logdir
        self.name = name
        self.extra = extra

    def log_path(self, start: int) -> Path:
        return self.logdir / f"relay-{self.name}-{start}.log"

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path(self.starts), "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kombu_ladder", "--log-level", "INFO", "--broker", self.broker_url,
                 "relay", "--report-every", "2", *self.extra],
                stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
            )
