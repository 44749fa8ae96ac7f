"""Lateness under mixed delays at the kombu level: (a) per-message TTL and (b) kombu_ladder with its relay."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

from kombu import Connection, Consumer, Exchange, Producer, Queue

from kombu_ladder.contract import CONTROL
from kombu_ladder.producer import LadderProducer
from kombu_ladder.topology import declare

from .common import Child, Config, Progress, Vhost, log, payload, queue_depth, summarize, wait_until

__all__ = ["TARGET", "delays", "Arrivals", "Backlog", "run_ttl", "run_ladder", "run_burst", "run"]

#: The queue every contender delivers to; a consumer records arrival times there.
TARGET = "bench.target"

#: The consumer-less queue of contender (a), dead-lettering to :data:`TARGET`.
TTL_WAIT = "bench.ttl-wait"


def delays(n: int, max_delay: float, seed: int) -> list[float]:
    """``n`` delays drawn uniformly from [1, max_delay] seconds, in random order."""
    rng = random.Random(seed)
    return [rng.uniform(1.0, max_delay) for _ in range(n)]


class Arrivals:
    """Consume :data:`TARGET` in a thread of its own and record ``(index, due_ms, arrival_ms)``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.records: list[tuple[int, int, float]] = []
        self.ready = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="arrivals", daemon=True)

    def _on_message(self, body: Any, message: Any) -> None:
        now = time.time() * 1000
        data = json.loads(message.body)
        self.records.append((data["i"], data["due"], now))
        message.ack()

    def _run(self) -> None:
        with Connection(self.url) as conn:
            with Consumer(conn.channel(), [Queue(TARGET, durable=True)], callbacks=[self._on_message],
                          prefetch_count=500, accept=["json"]):
                self.ready.set()
                while not self._stop:
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass

    def start(self) -> "Arrivals":
        """Start consuming; return once the consumer is registered."""
        self._thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the arrivals consumer did not start")
        return self

    def stop(self) -> None:
        """Stop consuming."""
        self._stop = True
        self._thread.join(5)

    def wait(self, n: int, deadline: float, label: str, sample: Optional[Callable[[], str]] = None) -> bool:
        """Wait until ``n`` messages arrived or the epoch-seconds ``deadline`` passes; show progress.

        ``sample`` is called on every poll; what it returns is shown beside the bar.
        """
        progress = Progress(n, label)
        while len(self.records) < n and time.time() < deadline:
            progress.update(len(self.records), sample() if sample else "")
            time.sleep(0.1)
        progress.update(len(self.records))
        progress.close("" if len(self.records) >= n else f"still waiting after {time.time() - deadline:+.0f}s")
        return len(self.records) >= n

    def lateness(self) -> list[float]:
        """Arrival minus due time, in ms, per arrived message."""
        return [arrival - due for _, due, arrival in self.records]

    def points(self, start: float) -> list[tuple[float, float]]:
        """``(due, lateness)`` per arrived message: due in seconds after ``start``, lateness in ms."""
        return [(round(due / 1000 - start, 3), round(arrival - due, 1)) for _, due, arrival in self.records]


class Backlog:
    """Sample the control queue's depth: the relay's backlog, its peak and when it peaked."""

    def __init__(self, conn: Connection, start: float) -> None:
        self.channel = conn.channel()
        self.start = start
        self.peak = 0
        self.peak_at = 0.0

    def __call__(self) -> str:
        _, depth, _ = self.channel.queue_declare(CONTROL, passive=True)
        if depth > self.peak:
            self.peak, self.peak_at = depth, round(time.time() - self.start, 1)
        return f"relay backlog {depth} (peak {self.peak})"


def _publish_all(ds: list[float], publish: Callable[[int, float, int], None], label: str,
                 due_at: Optional[list[int]] = None) -> float:
    """Publish message ``i`` with delay ``ds[i]``, or due at ``due_at[i]`` (epoch ms) when given."""
    progress = Progress(len(ds), label)
    for i, delay in enumerate(ds):
        now = time.time()
        due = int(now * 1000) + round(delay * 1000) if due_at is None else due_at[i]
        publish(i, now, due)
        if i % 100 == 0:
            progress.update(i)
    progress.update(len(ds))
    progress.close()
    return time.time()


def run_ttl(config: Config, ds: list[float]) -> dict[str, Any]:
    """Contender (a): per-message ``expiration`` into a consumer-less queue dead-lettering to the target."""
    with Vhost("ttl") as vhost, vhost.connection() as conn:
        channel = conn.channel()
        Queue(TARGET, durable=True)(channel).declare()
        Queue(TTL_WAIT, Exchange(""), durable=True, queue_arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": TARGET})(channel).declare()
        arrivals = Arrivals(vhost.url).start()
        producer = Producer(channel)

        def publish(i: int, now: float, due: int) -> None:
            producer.publish(payload(i, due), routing_key=TTL_WAIT, exchange="", serializer=None,
                             content_type="application/json", delivery_mode=2, expiration=(due / 1000 - now))

        start = time.time()
        last = _publish_all(ds, publish, "(a) publish")
        arrivals.wait(len(ds), last + max(ds) + config.lateness_grace, "(a) per-message TTL arrivals")
        arrivals.stop()
    return {"name": "(a) per-message TTL", "lateness": arrivals.lateness(),
            "summary": summarize(arrivals.lateness(), len(ds)), "points": arrivals.points(start)}


def run_ladder(config: Config, ds: list[float], *, relays: int = 1, name: str = "(b) kombu_ladder",
               due_at: Optional[Callable[[], list[int]]] = None) -> dict[str, Any]:
    """Contender (b): ``LadderProducer.publish(countdown=)`` with ``kombu_ladder.relay.Relay`` in ``relays``
    child processes. ``due_at`` gives the due times (epoch ms) instead, read once the relay runs."""
    with Vhost("ladder") as vhost, vhost.connection() as conn:
        declare(conn)
        channel = conn.channel()
        Queue(TARGET, durable=True)(channel).declare()
        arrivals = Arrivals(vhost.url).start()
        children = [Child([sys.executable, "-m", "bench.relay_proc", "--kind", "ours", "--url", vhost.url,
                           "--forever"], stdout=subprocess.PIPE) for _ in range(relays)]
        try:
            if not wait_until(lambda: queue_depth(conn, CONTROL)[1] >= relays, timeout=30):
                raise RuntimeError("the relay child did not start consuming")
            producer = LadderProducer(channel)

            def publish(i: int, now: float, due: int) -> None:
                producer.clock = lambda: now  # the due time we record is the one the producer computes
                countdown = (due - int(now * 1000)) / 1000
                producer.publish(payload(i, due), routing_key=TARGET, exchange="", serializer=None,
                                 content_type="application/json", delivery_mode=2, countdown=countdown)

            start = time.time()
            backlog = Backlog(conn, start)
            last = _publish_all(ds, publish, f"{name[:4]} publish", due_at() if due_at else None)
            arrivals.wait(len(ds), last + max(ds) + config.lateness_grace, f"{name} arrivals", backlog)
        finally:
            for child in children:
                child.stop(sig=15)
            arrivals.stop()
        outs = [child.proc.stdout.read() if child.proc.stdout else "" for child in children]
    counters: dict[str, Any] = {}
    for out in outs:
        for key, value in (json.loads(out.strip().splitlines()[-1]) if out.strip() else {}).items():
            if isinstance(value, (int, float)) and key not in ("first", "last"):
                counters[key] = counters.get(key, 0) + value
    summary = summarize(arrivals.lateness(), len(ds))
    summary["hops_per_message"] = counters.get("hops", 0) / len(ds) if counters else None
    # the relay processes' CPU time (first message to last settle) over what they delivered
    delivered = counters.get("delivered", 0)
    summary["relay_cpu_us_per_message"] = counters["cpu_s"] * 1e6 / delivered if delivered and "cpu_s" in counters \
        else None
    summary["max_backlog"], summary["max_backlog_at_s"] = backlog.peak, backlog.peak_at
    return {"name": name, "lateness": arrivals.lateness(), "summary": summary, "relay": counters,
            "points": arrivals.points(start)}


def run_burst(config: Config) -> dict[str, Any]:
    """The burst: ``config.burst_n`` messages published together, due within one second that starts
    ``config.burst_lead`` s (20) after the next whole second, each at a random ms of it.

    Every countdown is just over 20 s: two 10 s hops, so the relay takes the whole burst
    from the rung again at the start of the due second, while it delivers the first
    of them (the hardest case: with a countdown under 20 s it would hold them for 10 s).
    """
    rng = random.Random(14)
    offsets = [rng.randrange(1000) for _ in range(config.burst_n)]

    def due_at() -> list[int]:
        second = (math.ceil(time.time()) + int(config.burst_lead)) * 1000
        return [second + offset for offset in offsets]

    ds = [config.burst_lead + 2.0] * config.burst_n  # the wait bound: every one is due within this
    result = run_ladder(config, ds, name=f"(b) kombu_ladder, burst: {config.burst_n:,} due in one second",
                        due_at=due_at)
    result.pop("points", None)  # one second wide: nothing to plot
    return result


def run(config: Config, seed: int = 5) -> dict[str, Any]:
    """Run contenders (a) and (b) one after the other on the same delays, then the burst."""
    ds = delays(config.kombu_n, config.max_delay, seed)
    results = {}
    log(f"lateness (a): per-message TTL, {len(ds)} messages, delays 1-{config.max_delay:g}s")
    results["a"] = run_ttl(config, ds)
    log(f"lateness (b): kombu_ladder, {len(ds)} messages, delays 1-{config.max_delay:g}s")
    results["b"] = run_ladder(config, ds)
    if config.name == "full":  # diagnostic: does a second relay process shorten the late tail?
        log(f"lateness (b2): kombu_ladder with 2 relay processes, {len(ds)} messages")
        results["b2"] = run_ladder(config, ds, relays=2, name="(b2) kombu_ladder, 2 relay processes")
    log(f"lateness (burst): kombu_ladder, {config.burst_n} messages due within one second")
    try:  # a failed burst must not lose (a) and (b)
        results["burst"] = run_burst(config)
    except Exception as exc:  # noqa: BLE001 - reported in the page
        log(f"lateness (burst) FAILED: {exc!r}")
        results["burst"] = {"name": "(b) kombu_ladder, burst", "error": f"{type(exc).__name__}: {exc}"}
    return results
