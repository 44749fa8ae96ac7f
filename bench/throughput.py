"""Relay throughput: hops/s through ``kombu_ladder``'s relay against a raw py-amqp loop, 1 and 2 processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

import amqp

from kombu_ladder.contract import CONTROL, EXCHANGE, MESSAGE_TYPE, rung_name
from kombu_ladder.envelope import scheduled_headers
from kombu_ladder.topology import declare

from .common import Child, Config, Progress, Vhost, log, median, payload, queue_depth, wait_until

__all__ = ["preload_control", "relay_round", "run"]

#: The rounds of one repeat: (relay kind, processes). Each ours-x1 round is paired with the raw
#: round just before it, so a ratio compares two measurements taken seconds apart.
ROUNDS = (("raw", 1), ("ours", 1), ("ours", 2))


def preload_control(vhost: Vhost, n: int, *, due_in: float, target: str = "bench.target",
                    label: str = "preload", body: Callable[[int, int], bytes] = payload) -> None:
    """Put ``n`` expired scheduled messages (``body(i, due_ms)``: by default 600 bytes, persistent) into the
    control queue.

    They are published into the 1 s rung, so they reach the control queue by
    dead-lettering, with ``x-death`` headers, as in production. No relay runs.
    """
    with vhost.connection() as conn:
        declare(conn)
        before, _ = queue_depth(conn, CONTROL)
        channel = conn.default_channel
        due = int((time.time() + due_in) * 1000)
        headers = scheduled_headers({}, exchange="", routing_key=target, due_at=due, content_type="application/json")
        progress = Progress(n, label)
        for i in range(n):
            message = amqp.Message(body(i, due), content_type="application/json", delivery_mode=2,
                                   type=MESSAGE_TYPE, application_headers=headers)
            channel.basic_publish(message, exchange=EXCHANGE, routing_key=rung_name(1))
            if i % 500 == 0:
                progress.update(i)
        progress.update(n)
        wait_until(lambda: queue_depth(conn, CONTROL)[0] >= before + n, timeout=60 + n / 1000)
        progress.close(f"{queue_depth(conn, CONTROL)[0]} in {CONTROL}")


def relay_round(vhost: Vhost, kind: str, processes: int, *, expected: int, timeout: float = 600,
                profile: Optional[str] = None, options: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``processes`` relays of ``kind`` over what waits in the control queue; return the rate.
    ``options``: more arguments of ``bench.relay_proc`` (the raw loop's target)."""
    children = []
    try:
        for p in range(processes):
            argv = [sys.executable, "-m", "bench.relay_proc", "--kind", kind, "--url", vhost.url, *options]
            if profile:
                argv += ["--profile", f"{profile}.{kind}.{p}"]
            children.append(Child(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
        for child in children:
            if child.proc.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                raise RuntimeError(f"relay child {child.pid} did not start")
        for child in children:
            child.proc.stdin.write("go\n")  # type: ignore[union-attr]
            child.proc.stdin.flush()  # type: ignore[union-attr]
        results = []
        for child in children:
            out, _ = child.proc.communicate(timeout=timeout)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            child.stop()
    count = sum(r["count"] for r in results)
    firsts = [r["first"] for r in results if r["first"]]
    lasts = [r["last"] for r in results if r["last"]]
    elapsed = (max(lasts) - min(firsts)) if firsts and lasts else float("nan")
    cpu = sum(r.get("cpu_s", 0.0) for r in results)
    return {"kind": kind, "processes": processes, "count": count, "expected": expected,
            "seconds": elapsed, "rate": count / elapsed if elapsed and elapsed > 0 else 0.0,
            "cpu_us_per_hop": 1e6 * cpu / count if count else float("nan")}


def _purge(vhost: Vhost, queue: str) -> None:
    with vhost.connection() as conn:
        conn.default_channel.queue_purge(queue)


def run(config: Config) -> dict[str, Any]:
    """Measure hops/s for every round of :data:`ROUNDS`, ``config.repeats`` times, in one vhost."""
    n = config.relay_n
    rounds: list[dict[str, Any]] = []
    with Vhost("relay") as vhost:
        for repeat in range(config.relay_repeats):
            for kind, processes in ROUNDS:
                log(f"relay throughput: repeat {repeat + 1}/{config.relay_repeats}, {kind} x{processes}, {n} messages")
                preload_control(vhost, n, due_in=7200, label=f"preload {kind} x{processes}")
                result = relay_round(vhost, kind, processes, expected=n)
                _purge(vhost, rung_name(3600))
                log(f"  {kind} x{processes}: {result['count']} hops in {result['seconds']:.2f}s "
                    f"= {result['rate']:.0f}/s")
                rounds.append(result)
    summary: dict[str, dict[str, Any]] = {}
    for kind, processes in ROUNDS:
        rates = [r["rate"] for r in rounds if r["kind"] == kind and r["processes"] == processes]
        cpu = [r["cpu_us_per_hop"] for r in rounds if r["kind"] == kind and r["processes"] == processes]
        summary[f"{kind}x{processes}"] = {"median": median(rates), "rates": rates, "cpu_us_per_hop": median(cpu)}
    raw1 = summary["rawx1"]["median"]
    pairs = list(zip([x for x in rounds if x["kind"] == "ours" and x["processes"] == 1],
                     [x for x in rounds if x["kind"] == "raw" and x["processes"] == 1]))
    ratios = [o["rate"] / r["rate"] for o, r in pairs if r["rate"]]
    # the raw loop's CPU per hop over ours: 1.0x or more is a relay that costs no more per hop
    cpu_ratios = [r["cpu_us_per_hop"] / o["cpu_us_per_hop"] for o, r in pairs
                  if o["cpu_us_per_hop"] and o["cpu_us_per_hop"] == o["cpu_us_per_hop"]]
    return {"n": n, "repeats": config.relay_repeats, "rounds": rounds, "summary": summary,
            "ratio": median(ratios) if ratios else float("nan"),
            "cpu_ratio": median(cpu_ratios) if cpu_ratios else float("nan"), "cpu_ratio_per_repeat": cpu_ratios,
            "ratio_of_medians": summary["oursx1"]["median"] / raw1 if raw1 else float("nan"),
            "ratio_per_repeat": ratios, "complete": all(r["count"] == n for r in rounds)}
