"""Issue 28: the metrics server bounds its connections: idle sockets time out, and never more than a cap stay open.

Without it, idle connections to ``/metrics`` (a port bound beyond loopback) held a thread and a file
descriptor each, forever: the relay sharing that process ran out of file descriptors and could not
reconnect to RabbitMQ.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from helpers import rabbitmqctl, vhost_url, wait_for
from kombu import Connection, Queue
from test_metrics import samples, scrape

from kombu_ladder import LadderProducer, declare
from kombu_ladder.metrics import MetricsServer
from kombu_ladder.relay import Counters
from kombu_ladder.serving import MAX_CONNECTIONS

#: The relay process's file descriptor limit in the test: its own needs (about 10) and the cap, with room.
RELAY_FILES = 48
#: Idle connections opened against it: many times the limit.
FLOOD = 300
#: Connections left pending when the relay reconnects.
PENDING = 100


def open_idle(port: int, count: int) -> list[socket.socket]:
    """Open ``count`` connections to ``port`` that never send a byte (one the server does not take within a
    second is given up, and three in a row end the flood: the server no longer accepts)."""
    sockets: list[socket.socket] = []
    failures = 0
    while len(sockets) < count and failures < 3:
        try:
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            failures = 0
        except OSError:
            failures += 1
    return sockets


def open_pending(port: int, count: int) -> list[socket.socket]:
    """Start ``count`` connections to ``port`` without waiting: they queue in the kernel until the server
    accepts them, taking any file descriptor the process frees meanwhile if it accepts whatever comes."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sockets.append(sock)
    return sockets


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed this idle connection (a read returns end of file at once)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


@contextlib.contextmanager
def serving(**options: Any) -> Iterator[MetricsServer]:
    server = MetricsServer(Counters(), port=0, enforcing=lambda: True, **options).start()
    try:
        yield server
    finally:
        server.stop()


def test_idle_connections_beyond_the_cap_are_closed_and_a_scrape_is_still_answered() -> None:
    with serving(read_timeout=60, max_connections=4) as server:
        idle = open_idle(server.port, 200)
        try:
            for _ in range(5):  # every fresh scrape is answered, though each comes after 200 idle sockets
                assert ("ladder_received_total", ()) in samples(scrape(server.url))
                idle += open_idle(server.port, 20)
            wait_for(lambda: sum(closed_by_server(s) for s in idle) >= len(idle) - 4, 10,
                     message="all but the cap's idle connections closed by the server")
            assert server._httpd.open_connections <= 4
        finally:
            for sock in idle:
                sock.close()


def test_an_idle_connection_is_closed_after_the_read_timeout() -> None:
    with serving(read_timeout=0.5) as server:
        idle = open_idle(server.port, 3)
        try:
            wait_for(lambda: all(closed_by_server(s) for s in idle), 10, message="idle connections timed out")
            wait_for(lambda: server._httpd.open_connections == 0, 5, message="their threads gone")
            assert ("ladder_received_total", ()) in samples(scrape(server.url))
        finally:
            for sock in idle:
                sock.close()


def test_the_options_are_checked() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        MetricsServer(Counters(), port=0, max_connections=0).start()
    with pytest.raises(ValueError, match="read_timeout"):
        MetricsServer(Counters(), port=0, read_timeout=0).start()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (RELAY_FILES, RELAY_FILES))


@pytest.mark.broker
def test_idle_sockets_never_stop_a_relay_from_reconnecting_and_delivering(fresh_vhost: str, tmp_path: Path) -> None:
    """The issue's case: a relay with a file limit, its metrics port flooded with idle sockets, then a reconnect."""
    assert MAX_CONNECTIONS + 20 < RELAY_FILES
    url = vhost_url(fresh_vhost)
    with Connection(url) as conn:
        declare(conn)
        Queue("t.files", durable=True)(conn.default_channel).declare()
    port = free_port()
    log = tmp_path / "relay.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "kombu_ladder", "relay", "--broker", url, "--metrics-port",
                                 str(port), "--metrics-interval", "1"], stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=_limit_files)  # noqa: PLW1509 - a resource limit, before exec
    idle: list[socket.socket] = []
    try:
        metrics = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: "ladder relay consuming" in log.read_text(), 30, message="the relay consuming",
                 on_timeout=log.read_text)
        idle = open_idle(port, FLOOD)
        assert len(idle) == FLOOD
        assert ("ladder_received_total", ()) in samples(scrape(metrics))  # answered among the idle ones
        idle += open_pending(port, PENDING)  # waiting to take any file the relay frees by reconnecting
        rabbitmqctl("close_all_connections", "-p", fresh_vhost, "issue 28: a reconnect with idle sockets open")
        with Connection(url) as conn:
            producer = LadderProducer(conn.default_channel)
            for n in range(20):
                producer.publish(f"m{n}".encode(), routing_key="t.files", countdown=1.2)

            def delivered() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                return conn.default_channel.queue_declare("t.files", passive=True)[1] == 20

            wait_for(delivered, 60, message="20 deliveries after the reconnect",
                     on_timeout=lambda: log.read_text()[-3000:])
        assert samples(scrape(metrics))[("ladder_delivered_total", ())] == 20
        assert "Too many open files" not in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()[-3000:]
    finally:
        for sock in idle:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
