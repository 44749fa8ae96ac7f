"""Bursts: N messages due in the same second, distinct or identical, through 1, 2 and 4 relays, beside the broker alone.

Every round publishes ``bursts_n`` messages with ``LadderProducer.publish`` (200-byte
persistent bodies), all due within one second that starts :func:`lead_s` seconds
after publishing begins, while the relays run: standalone ``kombu-ladder relay``
processes, or ``celery worker -P ladder`` workers (their relay bootstep). *Distinct*
messages are each due at a random millisecond of that second; *identical* ones are
byte for byte the same message (body, headers, due time). A consumer in a process of
its own stamps each arrival; lateness is arrival minus due, in milliseconds.

Beside them, in the same run, the broker alone: ``bursts_n`` expired 200-byte
persistent messages dead-lettered from one queue to another at once, with no client in
the path (see :func:`broker_only`), measured before the rounds and after them. A round's
delivery rate is given as a ratio to that rate.

``python -m bench.bursts --arrivals URL N DEADLINE`` is the arrivals consumer (a child).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional
from urllib.parse import unquote, urlparse

import amqp
from kombu import Queue

from kombu_ladder.contract import CONTROL
from kombu_ladder.producer import LadderProducer
from kombu_ladder.topology import declare

from .celery_app import Worker
from .common import (
    PUBLISHER_OPTIONS,
    Child,
    Config,
    Progress,
    Vhost,
    log,
    median,
    percentile,
    queue_depth,
    rabbitmqctl,
    wait_until,
)

__all__ = ["SHAPES", "KINDS", "RELAYS", "SIZE", "KEPT_UP_MS", "body", "broker_only", "lead_s", "read_arrivals",
           "Fleet", "Stamps", "burst_round", "raw_loop", "run", "main"]

#: Burst shapes: each message due at its own millisecond of the second, or every one the same message.
SHAPES = ("distinct", "identical")

#: How the relays run: ``kombu-ladder relay`` processes, or Celery workers started with ``-P ladder``.
KINDS = ("standalone", "worker")

#: Relays per round.
RELAYS = (1, 2, 4)

#: Body size of every message, in bytes (the broker-only figure's size).
SIZE = 200

#: The queue the bursts are delivered to.
TARGET = "bench.burst.target"

#: The broker-only rate's queues: messages wait in the first, then are dead-lettered into the second.
SOURCE, SINK = "bench.dl.source", "bench.dl.sink"

#: A round of distinct messages whose every one arrived within this many ms of its due time kept up with
#: the due times: its deliveries per second are their pace (a second's worth), not what the relays could do.
KEPT_UP_MS = 100.0


def _connect(url: str) -> amqp.Connection:
    parts = urlparse(url)
    conn = amqp.Connection(host=f"{parts.hostname}:{parts.port or 5672}", userid=parts.username or "guest",
                           password=parts.password or "guest", virtual_host=unquote(parts.path[1:]) or "/",
                           **PUBLISHER_OPTIONS)
    conn.connect()
    return conn


def body(i: int, due_ms: int) -> bytes:
    """A ``SIZE``-byte body that carries the message's index and due time (``i:due:`` then padding)."""
    head = b"%d:%d:" % (i, due_ms)
    return head + b"x" * (SIZE - len(head))


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by every live process of process group ``pgid``."""
    total = 0.0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    total += _cpu_s(int(name))
            except OSError:
                continue
    return total


def broker_pid() -> Optional[int]:
    """The OS process id of the broker ``rabbitmqctl`` talks to (its ``beam.smp``), when it says."""
    try:
        return int(json.loads(rabbitmqctl("status", "--formatter", "json"))["pid"])
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, TypeError):
        return None


class _Holder:
    """A consumer that takes every message of a queue and acks none, in a thread of its own."""

    def __init__(self, url: str, queue: str) -> None:
        self.conn = _connect(url)
        self.channel = self.conn.channel()
        self.held = 0
        self._stop = False
        self.channel.basic_consume(queue, callback=self._take)
        self._thread = threading.Thread(target=self._run, name="holder", daemon=True)
        self._thread.start()

    def _take(self, message: Any) -> None:
        self.held += 1

    def _run(self) -> None:
        while not self._stop:
            try:
                self.conn.drain_events(timeout=0.1)
            except socket.timeout:
                pass

    def release(self) -> float:
        """Close the channel (the broker requeues what it held); return when the close was asked for, in
        monotonic seconds."""
        self._stop = True
        self._thread.join(5)
        released = time.monotonic()
        self.channel.close()
        self.conn.close()
        return released


def broker_only(vhost: Vhost, n: int) -> dict[str, Any]:
    """Dead-letter ``n`` expired 200-byte persistent messages from one queue to another, by the broker alone.

    They are published into a queue with a message TTL and a dead-letter route, while a
    consumer takes each and acks none, so none expires in the meantime. Once every one
    is past its TTL the consumer's channel closes: the broker requeues them all, finds
    them expired and dead-letters them at once. The rate is ``n`` over the time from
    that close until the other queue holds all ``n`` (its depth, polled every 10 ms).
    """
    ttl = 10 + n / 2000  # seconds: longer than the publishing takes at 2,000/s
    conn = _connect(vhost.url)
    try:
        channel = conn.channel()
        for queue in (SOURCE, SINK):
            channel.queue_delete(queue)
        channel.queue_declare(SINK, durable=True, auto_delete=False)
        channel.queue_declare(SOURCE, durable=True, auto_delete=False, arguments={
            "x-message-ttl": int(ttl * 1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": SINK})
        holder = _Holder(vhost.url, SOURCE)
        progress = Progress(n, "broker only: publish")
        for i in range(n):
            channel.basic_publish(amqp.Message(body(i, 0), delivery_mode=2), exchange="", routing_key=SOURCE)
            if i % 1000 == 0:
                progress.update(i)
        published = time.monotonic()
        progress.update(n)
        progress.close()

        def depth(name: str) -> int:
            return int(channel.queue_declare(name, passive=True)[1])

        wait_until(lambda: holder.held >= n, 60, interval=0.05)
        time.sleep(max(0.0, published + ttl + 1 - time.monotonic()))
        early = depth(SINK)  # expired before the consumer took them: the figure would be wrong
        released = holder.release()
        last = None
        while time.monotonic() < released + 120 + n / 500:
            if depth(SINK) >= n:
                last = time.monotonic()
                break
            time.sleep(0.01)
        moved = depth(SINK)
        for queue in (SOURCE, SINK):
            channel.queue_delete(queue)
    finally:
        conn.close()
    if last is None or early or holder.held < n:
        log(f"  broker only: not measured ({holder.held:,} held, {early:,} expired early, {moved:,} moved)")
        return {"n": n, "moved": moved, "held": holder.held, "expired_early": early, "rate": None, "seconds": None}
    rate = n / (last - released)
    log(f"  broker only: {n:,} dead-lettered at {rate:,.0f}/s ({last - released:.2f} s)")
    return {"n": n, "moved": moved, "rate": rate, "seconds": last - released}


def raw_loop(vhost: Vhost, n: int) -> dict[str, Any]:
    """The same burst moved by a raw py-amqp loop (``bench.relay_proc --kind raw``): ``n`` expired scheduled
    ``SIZE``-byte persistent messages wait in the control queue, and the loop republishes each unchanged to
    :data:`TARGET` with pipelined confirms, acking with ``multiple=True`` once confirmed. Its rate is measured
    as the rounds' is: arrivals at the consumer over the time from the first to the last. It decides nothing,
    holds nothing and checks no cancellation: what a relay does beyond moving bytes is what the ratio shows.
    """
    from .throughput import preload_control, relay_round

    with vhost.connection() as conn:
        for queue in (TARGET, CONTROL):
            conn.default_channel.queue_purge(queue)
    preload_control(vhost, n, due_in=0, target=TARGET, label="raw loop: preload", body=body)
    stamps = Stamps(vhost.url, n, time.time() + 180 + n / 250)
    try:
        moved = relay_round(vhost, "raw", 1, expected=n, options=("--exchange", "", "--routing-key", TARGET))
        _late, span = stamps.collect()
    finally:
        stamps.stop()
    arrived = len(_late)
    rate = arrived / span if span else None
    cpu = moved["cpu_us_per_hop"] if moved["count"] else None
    log(f"  raw loop: {arrived:,}/{n:,} arrived at {rate or 0:,.0f}/s, {cpu or 0:,.0f} µs of CPU per message")
    return {"n": n, "arrived": arrived, "rate": rate, "seconds": span, "cpu_us": cpu}


def arrivals_main(url: str, n: int, deadline: float) -> None:
    """The arrivals consumer: print ``ready``, stamp each message of :data:`TARGET`, then print one JSON
    line: ``[[arrival, lateness], ...]`` in milliseconds (arrival from the first one; lateness is arrival
    minus the due time its body carries)."""
    conn = _connect(url)
    channel = conn.channel()
    stamps: list[tuple[float, int]] = []

    def on_message(message: Any) -> None:
        stamps.append((time.time() * 1000, int(bytes(message.body).split(b":", 2)[1])))

    channel.basic_consume(TARGET, no_ack=True, callback=on_message)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    try:
        while len(stamps) < n and time.time() < deadline:
            try:
                conn.drain_events(timeout=0.5)
            except socket.timeout:
                pass
    finally:
        start = stamps[0][0] if stamps else 0.0
        print(json.dumps([[round(at - start, 2), round(at - due, 2)] for at, due in stamps]), flush=True)
        conn.close()


def read_arrivals(out: str) -> tuple[list[float], Optional[float]]:
    """The lateness of every arrival (ms) and the time from the first arrival to the last (s), from the
    consumer's output."""
    stamps = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
    late = [lateness for _, lateness in stamps]
    span = (stamps[-1][0] - stamps[0][0]) / 1000 if len(stamps) > 1 else None
    return late, span


class Fleet:
    """``count`` relays of ``kind``, started together (ready once each consumes the control queue) and
    stopped together, their logs removed."""

    def __init__(self, vhost: Vhost, kind: str, count: int) -> None:
        self.relays: list[Any] = []
        self.logs: list[Any] = []
        try:
            for index in range(count):
                log_file = tempfile.NamedTemporaryFile(prefix=f"ladder-bench-burst-{kind}-", suffix=".log",
                                                       delete=False)
                self.logs.append(log_file)
                if kind == "standalone":
                    self.relays.append(Child([sys.executable, "-m", "kombu_ladder", "--broker", vhost.url,
                                              "--log-level", "WARNING", "relay", "--report-every", "3600"],
                                             stdout=log_file, stderr=log_file))
                else:
                    self.relays.append(Worker(vhost.url, "ladder", os.devnull, concurrency=1, pool="ladder",
                                              name=f"bench-burst-{index}-{os.getpid()}@%h"))
            with vhost.connection() as conn:
                if not wait_until(lambda: queue_depth(conn, CONTROL)[1] >= count, timeout=60 + 15 * count,
                                  interval=0.2):
                    raise RuntimeError(f"{count} {kind} relay(s) did not all consume {CONTROL}")
        except BaseException:
            self.stop()
            raise

    def cpu_s(self) -> float:
        """CPU seconds every process of every relay (a worker's pool included) used so far."""
        return sum(group_cpu_s(relay.pid if isinstance(relay, Child) else relay.child.pid) for relay in self.relays)

    def stop(self) -> None:
        """Stop every relay; remove the logs."""
        for relay in self.relays:
            relay.stop()
        for log_file in self.logs:
            log_file.close()
            os.unlink(log_file.name)
        self.relays, self.logs = [], []


class Stamps:
    """The arrivals consumer (:func:`arrivals_main`) in a child process, ready once started."""

    def __init__(self, url: str, n: int, deadline: float) -> None:
        self.deadline = deadline
        self.child = Child([sys.executable, "-m", "bench.bursts", "--arrivals", url, str(n), str(deadline)],
                           stdout=subprocess.PIPE)
        if self.child.proc.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            self.child.stop()
            raise RuntimeError("the arrivals consumer did not start")

    def collect(self) -> tuple[list[float], Optional[float]]:
        """Wait for the consumer to finish (all arrived, or its deadline); return :func:`read_arrivals`'s."""
        out, _ = self.child.proc.communicate(timeout=max(60.0, self.deadline - time.time() + 60))
        return read_arrivals(out)

    def stop(self) -> None:
        """End the consumer (if it is still running)."""
        self.child.stop()


def _fixed(now: float) -> Callable[[], float]:
    return lambda: now


def _summary(late: list[float], n: int) -> dict[str, Any]:
    return {
        "expected": n, "arrived": len(late),
        "first": min(late) if late else None, "p50": percentile(late, 50) if late else None,
        "p99": percentile(late, 99) if late else None, "last": max(late) if late else None,
        "early": sum(1 for v in late if v < 0),
    }


def lead_s(n: int) -> float:
    """Seconds from the start of publishing a burst of ``n`` to its due second: publishing ends well before
    the relays' hold window (10 s) opens, at 1,000 publishes a second or more."""
    return 15 + n / 1000


def burst_round(vhost: Vhost, shape: str, kind: str, relays: int, n: int) -> dict[str, Any]:
    """One burst: start the relays and the arrivals consumer, publish ``n`` messages due in one second, wait."""
    lead = lead_s(n)
    with vhost.connection() as conn:
        for queue in (TARGET, CONTROL):
            conn.default_channel.queue_purge(queue)
    fleet = Fleet(vhost, kind, relays)
    stamps: Optional[Stamps] = None
    try:
        second = math.ceil(time.time() + lead) * 1000  # a whole second
        rng = random.Random(24)
        dues = [second + (rng.randrange(1000) if shape == "distinct" else 0) for _ in range(n)]
        stamps = Stamps(vhost.url, n, second / 1000 + 180 + n / 250)
        cpu0 = fleet.cpu_s()
        beam = broker_pid()
        beam0 = _cpu_s(beam) if beam else 0.0
        with vhost.connection(transport_options=PUBLISHER_OPTIONS) as conn:
            producer = LadderProducer(conn.channel())
            progress = Progress(n, f"{shape} x{relays} {kind}: publish")
            t0 = time.time()
            for i, due in enumerate(dues):
                now = time.time()
                now_ms = math.floor(now * 1000)
                producer.clock = _fixed(now)  # the due time the producer computes is exactly ``due``
                producer.publish(body(0 if shape == "identical" else i, due), routing_key=TARGET, exchange="",
                                 content_type="application/octet-stream", delivery_mode=2,
                                 countdown=(due - now_ms) / 1000)
                if i % 1000 == 0:
                    progress.update(i)
            published = time.time()
            progress.update(n)
            progress.close(f"{n / (published - t0):,.0f}/s, the second starts {second / 1000 - published:.1f} s later")
        late, span = stamps.collect()
        cpu = fleet.cpu_s() - cpu0
        beam_cpu = (_cpu_s(beam) - beam0) if beam else None
    finally:
        if stamps is not None:
            stamps.stop()
        fleet.stop()
    summary = _summary(late, n)
    arrived = summary["arrived"]
    summary.update(
        shape=shape, kind=kind, relays=relays, publish_s=round(published - t0, 2),
        publish_to_due_s=round(second / 1000 - published, 2),
        rate=arrived / span if span else None,
        # distinct messages are due over a second: on time, their deliveries take that second, whatever the relays
        kept_up=shape == "distinct" and arrived == n and summary["last"] is not None and summary["last"] <= KEPT_UP_MS,
        relay_cpu_us=1e6 * cpu / arrived if arrived else None,
        broker_cpu_us=1e6 * beam_cpu / arrived if arrived and beam_cpu is not None else None,
    )
    return summary


def run(config: Config) -> dict[str, Any]:
    """Every shape, kind and relay count in one vhost, between two measurements of the broker alone."""
    n = config.bursts_n
    rounds: list[dict[str, Any]] = []
    alone: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    with Vhost("bursts") as vhost:
        with vhost.connection() as conn:
            declare(conn)
            Queue(TARGET, durable=True)(conn.default_channel).declare()
        log(f"bursts: the broker alone, {n:,} expired {SIZE}-byte persistent messages")
        alone.append(broker_only(vhost, n))
        log(f"bursts: a raw py-amqp loop moving {n:,} expired messages to the consumer")
        raw.append(raw_loop(vhost, n))
        for shape in SHAPES:
            for kind in KINDS:
                for relays in RELAYS:
                    log(f"bursts: {n:,} {shape} messages due in one second, {relays} {kind} relay(s)")
                    try:
                        result = burst_round(vhost, shape, kind, relays, n)
                    except Exception as exc:  # noqa: BLE001 - one failed round is reported, the others still run
                        log(f"  FAILED: {exc!r}")
                        result = {"shape": shape, "kind": kind, "relays": relays, "error": f"{type(exc).__name__}: "
                                  f"{exc}"}
                    else:
                        log(f"  {result['arrived']:,}/{n:,} arrived; lateness first {result['first']:,.0f} ms, "
                            f"p50 {result['p50']:,.0f}, p99 {result['p99']:,.0f}, last {result['last']:,.0f}; "
                            f"{result['early']} early; {result['rate'] or 0:,.0f}/s")
                    rounds.append(result)
        log(f"bursts: the broker alone again, {n:,} expired messages")
        alone.append(broker_only(vhost, n))
        log(f"bursts: the raw loop again, {n:,} expired messages")
        raw.append(raw_loop(vhost, n))
    rates = [a["rate"] for a in alone if a.get("rate")]
    reference = median(rates) if rates else None
    raw_rates = [r["rate"] for r in raw if r.get("rate")]
    raw_rate = median(raw_rates) if raw_rates else None
    for result in rounds:
        if reference and result.get("rate"):
            result["ratio"] = result["rate"] / reference
        if raw_rate and result.get("rate"):
            result["raw_ratio"] = result["rate"] / raw_rate
    return {"n": n, "size": SIZE, "lead_s": lead_s(n), "broker_only": alone, "broker_only_rate": reference,
            "raw_loop": raw, "raw_loop_rate": raw_rate, "rounds": rounds}


def main(argv: Optional[list[str]] = None) -> int:
    """``--arrivals URL N DEADLINE``: run the arrivals consumer."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 4 and args[0] == "--arrivals":
        arrivals_main(args[1], int(args[2]), float(args[3]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
