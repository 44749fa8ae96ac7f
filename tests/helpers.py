"""What every test tier shares: the test broker's address, waiting on a condition, queue depths, rabbitmqctl."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional
from urllib.parse import quote

import pytest

from kombu_ladder.contract import CONTROL, PARKING, rung_names
from kombu_ladder.controlplane import declare_control_plane

__all__ = ["BROKER_HOST", "BROKER_PORT", "IN_CI", "broker_reachable", "require_broker", "wait_for", "wait_until",
           "rabbitmqctl", "temporary_vhost", "vhost_url", "list_queues", "declared", "broker_release",
           "list_exchanges", "list_bindings",
           "list_consumers", "messages_by_queue", "celery_ladder_cli", "ladder_counters", "wait_for_counters",
           "ladder_depth", "queue_depth", "depth_on",
           "drain", "purge", "purge_ladder", "build_distribution"]

BROKER_HOST = os.environ.get("LADDER_TEST_HOST", "127.0.0.1")
BROKER_PORT = int(os.environ.get("LADDER_TEST_PORT", "5672"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: The checkout.
ROOT = Path(__file__).resolve().parents[1]


# -- the distribution ---------------------------------------------------------------------------


def build_distribution(outdir: Path, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    """``python -m build`` of the checkout into ``outdir``, one build at a time on this checkout.

    setuptools makes the sdist's tree in the checkout itself (``kombu_ladder-<version>/``) and removes it when
    done: two builds at once (a matrix stack's tests beside ``make test``'s, or ``make dist``) remove each
    other's tree half-way (``No such file or directory: 'kombu_ladder-0.1.0/...'``). A lock on a file in
    ``build/`` (git-ignored) makes the others wait.
    """
    lock = ROOT / "build" / "distribution.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return subprocess.run([sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
                              capture_output=True, text=True, timeout=timeout)


# -- the broker ---------------------------------------------------------------------------------

def broker_reachable() -> bool:
    try:
        with socket.create_connection((BROKER_HOST, BROKER_PORT), timeout=2):
            return True
    except OSError:
        return False


def require_broker() -> None:
    """Skip locally, but fail under CI=true, when RabbitMQ is unreachable."""
    if broker_reachable():
        return
    message = f"RabbitMQ is not reachable at {BROKER_HOST}:{BROKER_PORT}"
    if IN_CI:
        pytest.fail(message + " (CI=true: broker-tier tests must not skip)", pytrace=False)
    pytest.skip(message)


def vhost_url(vhost: str) -> str:
    """Return the guest AMQP URL of ``vhost`` on the test broker."""
    return f"amqp://guest:guest@{BROKER_HOST}:{BROKER_PORT}/{quote(vhost, safe='')}"


# -- waiting ------------------------------------------------------------------------------------

def wait_for(condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
             message: str = "condition", on_timeout: Optional[Callable[[], str]] = None) -> Any:
    """Poll ``condition`` until it is truthy and return its value; fail the test after ``timeout`` seconds,
    adding what ``on_timeout()`` says (a log tail, a diagnosis)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{on_timeout()}" if on_timeout else ""
            pytest.fail(f"timed out after {timeout:g}s waiting for {message}{extra}")
        time.sleep(interval)


def wait_until(condition: Callable[[], Any], timeout: float, message: str,
               on_timeout: Optional[Callable[[], str]] = None) -> Any:
    """:func:`wait_for` as the fault and cluster suites spell it: the message third, a 0.2 s poll."""
    return wait_for(condition, timeout, 0.2, message, on_timeout)


# -- Celery workers' relay counters -------------------------------------------------------------

def ladder_counters(app: Any, hostnames: Any = None, timeout: float = 2.0) -> dict[str, dict[str, Any]]:
    """What each named worker (every worker: None) answers to ``celery inspect ladder`` within ``timeout``
    seconds; a worker that did not answer is missing."""
    destination = None if hostnames is None else list(hostnames)
    replies = app.control.broadcast("ladder", reply=True, timeout=timeout,
                                    limit=None if destination is None else len(destination), destination=destination)
    return {host: counters for reply in replies or () for host, counters in reply.items()}


def wait_for_counters(app: Any, hostnames: Any, condition: Callable[[dict[str, dict[str, Any]]], Any],
                      message: str, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
    """Ask until every named worker answers and ``condition(counters)`` holds, and return the counters.

    A relay counts a delivery when the broker confirms it, which can come after the task has run
    and returned its result; and a busy worker may not answer one broadcast in time.
    """
    hostnames = list(hostnames)
    seen: dict[str, dict[str, Any]] = {}

    def answered() -> Any:
        seen.clear()
        seen.update(ladder_counters(app, hostnames))
        return set(hostnames) <= set(seen) and condition(seen)

    wait_for(answered, timeout, interval=0.2, message=message, on_timeout=lambda: f"last counters: {seen}")
    return dict(seen)


# -- rabbitmqctl --------------------------------------------------------------------------------

def rabbitmqctl(*args: str, node: Optional[str] = None, timeout: float = 60, check: bool = True) -> str:
    """Run ``rabbitmqctl -q [-n node] ARGS`` and return its output; raise naming the command when it fails."""
    command = ["rabbitmqctl", "-q", *(("-n", node) if node else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")
    return done.stdout


def _rows(*args: str) -> list[dict[str, Any]]:
    out = rabbitmqctl(*args, "--formatter", "json").strip()
    return json.loads(out) if out else []


@contextmanager
def temporary_vhost(vhost: str) -> Iterator[str]:
    """Create ``vhost`` with full permissions for guest; delete it afterwards."""
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost, check=False)


def list_queues(vhost: str, *fields: str, as_declared: bool = True) -> dict[str, dict[str, Any]]:
    """Return ``{name: {"durable", "auto_delete", "exclusive", "arguments" (a dict), *fields}}`` as the broker
    has them; ``as_declared``: the arguments less what the broker reports of its own (:func:`declared`)."""
    rows = _rows("list_queues", "-p", vhost, "name", "durable", "auto_delete", "exclusive", "arguments", *fields)
    out = {r["name"]: {**{k: r[k] for k in ("durable", "auto_delete", "exclusive", *fields)},
                       "arguments": {k: v for k, _type, v in r["arguments"]}} for r in rows}
    if as_declared:
        for queue in out.values():
            queue["arguments"] = declared(queue["arguments"])
    return out


def declared(arguments: dict[str, Any]) -> dict[str, Any]:
    """Queue arguments read back, less what the broker adds by itself: RabbitMQ 4.x reports
    ``x-queue-type: classic`` on every classic queue, declared with that argument or not (so on 4.x
    a read-back cannot tell them apart; RabbitMQ treats both declarations as equivalent there)."""
    if arguments.get("x-queue-type") == "classic" and broker_release() >= (4, 0):
        return {k: v for k, v in arguments.items() if k != "x-queue-type"}
    return arguments


@functools.cache
def broker_release() -> tuple[int, ...]:
    """The test broker's RabbitMQ release as (major, minor, patch), from what it tells a client."""
    from kombu import Connection

    with Connection(vhost_url("/")) as conn:
        conn.ensure_connection(max_retries=3)
        version = str(conn.connection.server_properties.get("version", "0"))
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def list_exchanges(vhost: str) -> dict[str, dict[str, Any]]:
    """Return ``{name: {"type", "durable", "auto_delete", "arguments"}}``."""
    rows = _rows("list_exchanges", "-p", vhost, "name", "type", "durable", "auto_delete", "arguments")
    return {r["name"]: {"type": r["type"], "durable": r["durable"], "auto_delete": r["auto_delete"],
                        "arguments": {k: v for k, _t, v in r["arguments"]}} for r in rows}


def list_bindings(vhost: str) -> set[tuple[str, str, str]]:
    """Return the ``(source exchange, destination queue, routing key)`` bindings of named exchanges."""
    rows = _rows("list_bindings", "-p", vhost, "source_name", "destination_name", "destination_kind", "routing_key")
    return {(r["source_name"], r["destination_name"], r["routing_key"])
            for r in rows if r["source_name"] and r["destination_kind"] == "queue"}


def list_consumers(vhost: str) -> list[dict[str, Any]]:
    """Return the consumers of ``vhost``: ``queue_name``, ``prefetch_count``, ``ack_required``."""
    return _rows("list_consumers", "-p", vhost, "queue_name", "prefetch_count", "ack_required")


def messages_by_queue(vhost: str, ctl: Callable[..., str] = rabbitmqctl) -> dict[str, int]:
    """Messages (ready and unacked) per queue of ``vhost``, as ``ctl`` (rabbitmqctl on some node) reports them."""
    out = ctl("list_queues", "-p", vhost, "name", "messages", "--no-table-headers")
    return {parts[0]: int(parts[1]) for parts in (line.split() for line in out.splitlines())
            if len(parts) == 2 and parts[1].isdigit()}


def ladder_depth(ctl: Callable[..., str], vhost: str) -> int:
    """Messages (ready and unacked) in the rungs and the control queue of ``vhost``."""
    names = set(rung_names()) | {CONTROL}
    return sum(n for name, n in messages_by_queue(vhost, ctl).items() if name in names)


def extra_requirement(extra: str) -> str:
    """The requirement an extra of the kombu-ladder distribution adds, written as a pip line writes it
    (``celery>=5.3,<6``): the lower bound first."""
    from importlib.metadata import metadata

    from packaging.requirements import Requirement

    for line in metadata("kombu-ladder").get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
            specs = sorted(requirement.specifier, key=lambda spec: (not spec.operator.startswith(">"), str(spec)))
            return requirement.name + ",".join(str(spec) for spec in specs)
    raise LookupError(f"kombu-ladder has no extra {extra!r}")


def celery_ladder_cli(broker_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A poolapp ladder ARGS`` on ``broker_url``, in a process of its own (tests/celery_tier/poolapp.py)."""
    here = Path(__file__).resolve().parent / "celery_tier"
    env = dict(os.environ, LADDER_POOL_BROKER=broker_url,
               PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "celery", "-A", "poolapp", "ladder", *args], cwd=here,
                          env=env, capture_output=True, text=True, timeout=120)


# -- queues over AMQP ---------------------------------------------------------------------------

_RAISE: Any = object()


def depth_on(channel: Any, queue: str) -> int:
    """Ready messages in ``queue``, asked passively on ``channel`` (a missing queue closes the channel)."""
    return int(channel.queue_declare(queue=queue, passive=True)[1])


def queue_depth(conn: Any, queue: str, *, if_missing: Any = _RAISE) -> Any:
    """Ready messages in ``queue``, asked passively on a channel of its own; ``if_missing`` when it does not
    exist, if given (else the channel error is raised)."""
    channel = conn.channel()
    try:
        return depth_on(channel, queue)
    except conn.channel_errors:
        if if_missing is _RAISE:
            raise
        return if_missing
    finally:
        try:
            channel.close()
        except Exception:  # noqa: BLE001 - closed by the broker on a missing queue
            pass


def drain(conn: Any, queue: str, *, give_back: bool = False) -> list[Any]:
    """Take every message of ``queue``, head first; return them (py-amqp messages).

    With ``give_back`` each goes back to its place (taken unacked, then the channel is closed).
    """
    channel = conn.channel()
    messages = []
    try:
        while (message := channel.basic_get(queue, no_ack=not give_back)) is not None:
            messages.append(message)
    finally:
        channel.close()
    return messages


def purge(conn: Any, *queues: str) -> None:
    """Empty each of ``queues`` that exists (a missing one is fine)."""
    for name in queues:
        channel = conn.channel()
        try:
            channel.queue_purge(name)
        except conn.channel_errors:
            pass
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - closed by the broker on a missing queue
                pass


def purge_ladder(conn: Any) -> None:
    """Empty every ladder queue that exists, so one test's leftovers never reach another."""
    purge(conn, *rung_names(), CONTROL, PARKING)


def recreate_stream(conn: Any, stream: str) -> None:
    """Delete ``stream`` and declare the control plane again: a new, empty stream under the same name."""
    channel = conn.channel()
    try:
        channel.queue_delete(stream)
        declare_control_plane(channel)
    finally:
        channel.close()
