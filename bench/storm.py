"""Malformed storms: how late valid messages are behind 20,000 malformed ones, and a storm to one missing exchange.

``python -m bench.storm [--code DIR] [--malformed N] [--valid N] [--spread S] [--missing N]``
runs a standalone relay (``python -m kombu_ladder relay``) from ``DIR`` (default: this
tree; give a checkout of another commit to compare) in a private vhost, and prints one
JSON line. The storm: with the relay running, a publisher puts N malformed messages
(five kinds, round robin) on ``acemq.schedule.due``, then schedules the valid ones
through the ladder, due uniformly over the next ``S`` seconds (``--spread 0``, the
default: due at once, so each waits behind the whole storm in the control queue). A
consumer stamps each valid one on arrival; lateness is arrival minus due. The
missing-exchange storm: N messages to one exchange that does not exist, timed from the
first publish to the last one parked. The relay's CPU time per message (independent of
what else the machine runs) and its log lines are counted too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import amqp

from kombu_ladder.contract import CONTROL, EXCHANGE, PARKING, rung_name
from kombu_ladder.envelope import scheduled_headers
from kombu_ladder.plan import place
from kombu_ladder.topology import declare

from .common import ROOT, Vhost, log, percentile, queue_depth, wait_until

__all__ = ["run", "main"]

#: The target of the valid messages.
TARGET = "storm.valid"


def _malformed(n: int) -> dict[str, Any]:
    """Headers of the n-th malformed message: five kinds, none with a valid envelope."""
    due = int(time.time() * 1000)
    good = scheduled_headers({"n": n}, exchange="", routing_key=TARGET, due_at=due, content_type="text/plain")
    kind = n % 5
    if kind == 0:
        return {}
    if kind == 1:
        return {**good, "x-schedule-due-at": "soon"}
    if kind == 2:
        return {k: v for k, v in good.items() if k != "x-schedule-routing-key"}
    if kind == 3:
        return {**good, "x-schedule-exchange": 42}
    return {**good, "x-schedule-due-at": -5}


def _connect(url: str) -> amqp.Connection:
    from urllib.parse import unquote, urlparse

    parts = urlparse(url)
    conn = amqp.Connection(host=f"{parts.hostname}:{parts.port or 5672}", userid="guest", password="guest",
                           virtual_host=unquote(parts.path[1:]))
    conn.connect()
    return conn


class Arrivals(threading.Thread):
    """Consume the target queue and stamp each message's arrival."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.conn = _connect(url)
        self.late: list[float] = []
        self.stop = False

    def run(self) -> None:
        channel = self.conn.channel()
        channel.basic_consume(TARGET, no_ack=True, callback=self._arrived)
        while not self.stop:
            try:
                self.conn.drain_events(timeout=0.2)
            except OSError:
                continue

    def _arrived(self, message: Any) -> None:
        now = time.time()
        due_ms = int(bytes(message.body).split(b":")[1])
        self.late.append(now - due_ms / 1000)


def _relay(url: str, code: str, log_path: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, ROOT]))
    return subprocess.Popen([sys.executable, "-m", "kombu_ladder", "--broker", url, "--log-level", "INFO", "relay"],
                            cwd=tempfile.gettempdir(), env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(*, code: str = ROOT, malformed: int = 20_000, valid: int = 2_000, spread: float = 0.0,
        missing: int = 5_000) -> dict[str, Any]:
    """Run both storms against the relay found in ``code``; return the figures."""
    result: dict[str, Any] = {"code": code, "malformed": malformed, "valid": valid, "spread_s": spread,
                              "missing": missing}
    with Vhost("storm") as vhost, tempfile.NamedTemporaryFile("r", suffix=".log") as relay_log:
        with vhost.connection() as conn:
            declare(conn)
            conn.default_channel.queue_declare(TARGET, durable=True, auto_delete=False)
        relay = _relay(vhost.url, code, relay_log.name)
        try:
            with vhost.connection() as conn:
                wait_until(lambda: queue_depth(conn, CONTROL)[1] == 1, 60)
                arrivals = Arrivals(vhost.url)
                arrivals.start()
                publisher = _connect(vhost.url)
                channel = publisher.channel()
                cpu = _cpu_s(relay.pid)
                started = time.time()
                for n in range(malformed):
                    channel.basic_publish(amqp.Message(b"bad", delivery_mode=2, application_headers=_malformed(n)),
                                          exchange="", routing_key=CONTROL)
                queued = time.time()
                for n in range(valid):
                    now = time.time()
                    due = int((queued + spread * n / valid) * 1000) if spread else int(now * 1000)
                    rung = place(due, int(now * 1000))
                    headers = scheduled_headers({}, exchange="", routing_key=TARGET, due_at=due,
                                                content_type="text/plain")
                    channel.basic_publish(amqp.Message(b"valid:%d:%d" % (due, n), delivery_mode=2,
                                                       application_headers=headers),
                                          exchange="" if rung is None else EXCHANGE,
                                          routing_key=CONTROL if rung is None else rung_name(rung))
                result["publish_s"] = round(time.time() - started, 2)
                wait_until(lambda: queue_depth(conn, PARKING)[0] >= malformed, timeout=300, interval=0.05)
                result["malformed_parked_s"] = round(time.time() - started, 2)
                wait_until(lambda: len(arrivals.late) >= valid, timeout=300, interval=0.05)
                result["relay_cpu_ms_per_message"] = round((_cpu_s(relay.pid) - cpu) * 1000 / (malformed + valid), 3)
                arrivals.stop = True
                late = arrivals.late
                result["late_s"] = {"min": round(min(late), 3), "median": round(percentile(late, 50), 3),
                                    "p99": round(percentile(late, 99), 3), "max": round(max(late), 3),
                                    "arrived": len(late)}
                result["parked"] = queue_depth(conn, PARKING)[0]
                conn.default_channel.queue_purge(PARKING)

                missing_headers = scheduled_headers({}, exchange="storm.missing", routing_key="k",
                                                    due_at=int(time.time() * 1000), content_type="text/plain")
                cpu = _cpu_s(relay.pid)
                started = time.time()
                for _ in range(missing):
                    channel.basic_publish(amqp.Message(b"to nowhere", delivery_mode=2,
                                                       application_headers=missing_headers),
                                          exchange="", routing_key=CONTROL)
                wait_until(lambda: queue_depth(conn, PARKING)[0] >= missing, timeout=300, interval=0.05)
                result["missing_exchange_s"] = round(time.time() - started, 2)
                result["missing_relay_cpu_s"] = round(_cpu_s(relay.pid) - cpu, 2)
                publisher.close()
        finally:
            relay.terminate()
            relay.wait(30)
        result["relay_log_lines"] = sum(1 for _ in open(relay_log.name))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", default=ROOT, help="directory holding the kombu_ladder to run (default: this tree)")
    parser.add_argument("--malformed", type=int, default=20_000)
    parser.add_argument("--valid", type=int, default=2_000)
    parser.add_argument("--spread", type=float, default=0.0, help="seconds over which the valid ones fall due")
    parser.add_argument("--missing", type=int, default=5_000)
    args = parser.parse_args()
    log(f"storm: {args.malformed} malformed ahead of {args.valid} valid, then {args.missing} to a missing exchange")
    print(json.dumps(run(code=os.path.abspath(args.code), malformed=args.malformed, valid=args.valid,
                         spread=args.spread, missing=args.missing)))


if __name__ == "__main__":
    main()
