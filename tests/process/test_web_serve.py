"""``kombu-ladder web`` as a user runs it (on the simulator: no broker): it serves on loopback, a read-only one has
no action, and SIGTERM or SIGINT stops it with exit status 0."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from helpers import wait_for

pytestmark = pytest.mark.process

VENV_BIN = Path(sys.executable).parent


class Served:
    """``kombu-ladder web`` on a free loopback port, over a simulated broker of its own."""

    def __init__(self, tmp: Path, *args: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "kombu-ladder"), "web", "--broker", f"ladder-sim://web-{self.port}", "--port",
             str(self.port), "--index", str(tmp / "index.sqlite"), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def get(self, path: str, data: Optional[bytes] = None) -> tuple[int, Any, str]:
        """Status, headers (case-insensitive) and body of a request to the console."""
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + path, data=data), timeout=10) as answer:
                return answer.status, answer.headers, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read().decode()

    def serving(self) -> bool:
        assert self.proc.poll() is None, self.proc.communicate()[0]
        try:
            return self.get("/")[0] == 200
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return self.proc.returncode, out


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    server = Served(tmp_path, *getattr(request, "param", ()))
    try:
        wait_for(server.serving, 60, interval=0.2, message="kombu-ladder web to serve")
        yield server
    finally:
        server.stop(signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_it_serves_on_loopback_and_stops_on_a_signal(served: Served, sig: int) -> None:
    status, headers, page = served.get("/")
    assert status == 200 and "acemq.schedule.1h" in page
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert served.get("/static/console.css")[1]["Content-Type"].startswith("text/css")
    code, out = served.stop(sig)
    assert code == 0, out
    assert f"ladder console on http://127.0.0.1:{served.port}/" in out and "ladder console stopped" in out


@pytest.mark.parametrize("served", [("--read-only",)], indirect=True)
def test_a_read_only_console_has_no_action(served: Served) -> None:
    page = served.get("/waiting")[2]
    assert "read-only" in page and "/confirm/" not in page
    assert served.get("/act/cancel", data=b"id=x")[0] == 404
    assert served.get("/confirm/cancel?id=x")[0] == 404
    code, out = served.stop()
    assert code == 0, out


def test_it_prints_the_url_to_open_on_stdout_and_warns_of_nothing(tmp_path: Path) -> None:
    """Issue 40: one line on stdout with the URL (the port bound, with --port 0), as uvicorn and Flower print
    theirs; nothing logged at WARNING while it starts and serves."""
    proc = subprocess.Popen(
        [str(VENV_BIN / "kombu-ladder"), "web", "--broker", f"ladder-sim://web-url-{id(tmp_path)}", "--port", "0",
         "--index", str(tmp_path / "index.sqlite")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().rstrip("\n")  # blocks until it listens, or ends empty if it died
        match = re.fullmatch(r"ladder console on (http://127\.0\.0\.1:(\d+)/)", line)
        assert match and int(match.group(2)) != 0, (line, proc.poll())
        with urllib.request.urlopen(match.group(1), timeout=10) as answer:
            assert answer.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "", out  # the URL was the one line
    assert "WARNING" not in err and "ladder console stopped" in err, err
