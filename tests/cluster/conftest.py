"""Cluster-test fixtures: the private three-node cluster, a vhost per test, and the failure matrix."""

from __future__ import annotations

import json
import os
import pwd
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
from helpers import IN_CI, broker_reachable

from .clusterkit import Cluster

#: Where the matrix is written (``build/`` is git-ignored).
BUILD_DIR = Path(__file__).resolve().parents[2] / "build"

#: One row per scenario: profile, failure, lost, duplicated, time to resume, and the details.
MATRIX: list[dict[str, Any]] = []

#: One row per relay-throughput run: queue_type, relays, messages, seconds, per_second.
THROUGHPUT: list[dict[str, Any]] = []

#: What the cluster ran: its release and metadata store (one line, printed with the matrix).
BOOTED: list[str] = []


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message + " (CI=true: cluster tests must not skip)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Boot three private RabbitMQ nodes on loopback, joined into one cluster; stop them at the end."""
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        _unavailable("rabbitmq-server is not installed")
    if not broker_reachable():
        # The shared node runs epmd and owns the Erlang cookie the CLI and our nodes use.
        _unavailable("the shared RabbitMQ is not running, so no private cluster is started either")
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "rabbitmq":
        _unavailable("private RabbitMQ nodes can only be started as root or as the rabbitmq user")
    with Cluster() as booted:
        BOOTED.append(f"broker: RabbitMQ {booted.release}, three nodes, metadata in {booted.metadata_store}")
        yield booted


@pytest.fixture
def cluster_vhost(cluster: Cluster) -> Iterator[str]:
    vhost = cluster.new_vhost()
    try:
        yield vhost
    finally:
        try:
            cluster.any_ctl("delete_vhost", vhost)
        except RuntimeError:
            pass


@pytest.fixture
def matrix_row(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict a scenario fills with its row of the failure matrix."""
    row: dict[str, Any] = {}
    yield row
    if row:
        MATRIX.append({"test": request.node.name, **row})
        print(f"\nMATRIX {json.dumps(row)}")


def matrix_lines() -> list[str]:
    lines = [*BOOTED, "| profile | failure | lost | duplicated | time to resume |", "|---|---|---|---|---|"]
    for row in MATRIX:
        lines.append(f"| {row['profile']} | {row['failure']} | {row['lost']} | {row['duplicated']} | "
                     f"{row['resume_s']:.1f} s |")
    return lines


def throughput_lines() -> list[str]:
    base = {row["queue_type"]: row["per_second"] for row in THROUGHPUT if row["relays"] == 1}
    lines = ["| profile | relays | messages/s | ratio to one relay |", "|---|---|---|---|"]
    for row in THROUGHPUT:
        one = base.get(row["queue_type"])
        ratio = f"{row['per_second'] / one:.2f}" if one else "-"
        lines.append(f"| {row['queue_type']} | {row['relays']} | {row['per_second']} | {ratio} |")
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    BUILD_DIR.mkdir(exist_ok=True)
    if THROUGHPUT:
        (BUILD_DIR / "cluster-throughput.txt").write_text("\n".join(throughput_lines()) + "\n")
        terminalreporter.section("cluster relay throughput")
        for line in throughput_lines():
            terminalreporter.write_line(line)
    if not MATRIX:
        return
    (BUILD_DIR / "cluster-matrix.json").write_text(json.dumps(MATRIX, indent=2) + "\n")
    (BUILD_DIR / "cluster-matrix.txt").write_text("\n".join(matrix_lines()) + "\n")
    terminalreporter.section("cluster failure matrix")
    for line in matrix_lines():
        terminalreporter.write_line(line)
    for row in MATRIX:
        details = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("profile", "failure"))
        terminalreporter.write_line(f"{row['profile']} / {row['failure']}: {details}")
