"""The operations page's dashboard picture: a real relay's /metrics, scraped while a workload runs, drawn as
the Grafana dashboard (docs/grafana/ladder.json) shows it.

Run: ``python -m bench.dashboard`` (needs RabbitMQ; a private vhost; about 3 minutes). Writes
``docs/_static/dashboard.png`` and the scrapes to ``build/dashboard-scrapes.json``.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request

from kombu import Connection, Exchange, Producer, Queue
from prometheus_client.parser import text_string_to_metric_families

from kombu_ladder import LadderProducer, declare
from kombu_ladder.contract import CONTROL, EXCHANGE, rung_names
from kombu_ladder.observe import REASONS

from .common import ROOT, Child, Vhost, log, wait_until

#: Seconds of publishing, of draining afterwards, and between two scrapes.
PUBLISH_FOR, DRAIN_FOR, SCRAPE_EVERY = 120.0, 70.0, 2.0

OUT = os.path.join(ROOT, "docs", "_static", "dashboard.png")
SCRAPES = os.path.join(ROOT, "build", "dashboard-scrapes.json")


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - the local relay
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def workload(url: str, stop: threading.Event) -> None:
    """Delays of 1-60 s at about 20 a second, a few of 20 min, and now and then a malformed or unroutable one."""
    rng = random.Random(16)
    with Connection(url) as conn:
        producer = LadderProducer(conn.default_channel)
        raw = Producer(conn.default_channel)
        started, tick = time.monotonic(), 0
        while not stop.is_set() and time.monotonic() - started < PUBLISH_FOR:
            tick += 1
            for _ in range(2):
                producer.publish(b"x" * 200, exchange="", routing_key="dash.target", countdown=rng.uniform(1, 60))
            if tick % 10 == 0:
                producer.publish(b"x", exchange="", routing_key="dash.target", countdown=rng.uniform(1200, 1500))
            if tick % 97 == 0:  # no x-schedule-* headers: parked as malformed
                raw.publish(b"not scheduled", exchange=EXCHANGE, routing_key=CONTROL)
            if tick % 131 == 0:  # a target exchange that does not exist: parked as unroutable
                producer.publish(b"x", exchange="dash.missing", routing_key="k", countdown=rng.uniform(1, 20))
            time.sleep(max(0.0, started + tick * 0.1 - time.monotonic()))


def run() -> list[tuple[float, dict[str, float]]]:
    with Vhost("dashboard") as vhost:
        with vhost.connection() as conn:
            declare(conn)
            Queue("dash.target", Exchange(""), durable=True)(conn.default_channel).declare()
        log_path = os.path.join(ROOT, "build", "dashboard-relay.log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "w") as sink, Child([sys.executable, "-m", "kombu_ladder", "relay", "--broker", vhost.url,
                                                 "--metrics-port", "0", "--metrics-interval", "1"], stdout=sink,
                                                stderr=subprocess.STDOUT):
            found = wait_until(lambda: re.search(r"on (http://\S+/metrics)", open(log_path).read()), timeout=30)
            url = found.group(1)
            stop = threading.Event()
            producer = threading.Thread(target=workload, args=(vhost.url, stop), daemon=True)
            producer.start()
            scrapes, started = [], time.monotonic()
            while time.monotonic() - started < PUBLISH_FOR + DRAIN_FOR:
                scrapes.append((time.time(), scrape(url)))
                time.sleep(max(0.0, started + len(scrapes) * SCRAPE_EVERY - time.monotonic()))
            stop.set()
            producer.join(30)
    return scrapes


def series(scrapes: list[tuple[float, dict[str, float]]], key: str) -> list[float]:
    return [values.get(key, 0.0) for _, values in scrapes]


def plot(scrapes: list[tuple[float, dict[str, float]]], out: str = OUT) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = scrapes[0][0]
    xs = [(t - t0) for t, _ in scrapes]
    fig, axes = plt.subplots(2, 2, figsize=(13, 7.5), constrained_layout=True)
    (depth_ax, rate_ax), (heat_ax, park_ax) = axes
    rungs = [series(scrapes, f"ladder_queue_messages{{queue={q}}}") for q in rung_names()]
    depth_ax.stackplot(xs, *rungs, labels=rung_names())
    depth_ax.set_title("Rung depths (ladder_queue_messages)")
    depth_ax.legend(loc="upper left", fontsize=8)
    dts = [b - a for a, b in zip(xs, xs[1:])]
    mid = [(a + b) / 2 for a, b in zip(xs, xs[1:])]
    for name in ("delivered", "hops", "received"):
        values = series(scrapes, f"ladder_{name}_total{{}}")
        rate_ax.plot(mid, [max(0.0, b - a) / dt for a, b, dt in zip(values, values[1:], dts)], label=name)
    rate_ax.set_title("Deliveries and hops per second (rate of ladder_*_total)")
    rate_ax.legend(loc="upper left", fontsize=8)
    bounds = sorted({float(m.group(1)) for key in scrapes[-1][1]
                     if (m := re.match(r"ladder_delivery_lateness_seconds_bucket\{le=([^}]+)\}", key))})
    cumulative = [[series(scrapes, f"ladder_delivery_lateness_seconds_bucket{{le={_le(b)}}}")[i] for b in bounds]
                  for i in range(len(scrapes))]
    per_bucket = [[row[j] - (row[j - 1] if j else 0) for j in range(len(bounds))] for row in cumulative]
    increase = [[max(0.0, b - a) for a, b in zip(p, q)] for p, q in zip(per_bucket, per_bucket[1:])]
    used = [j for j in range(len(bounds)) if any(row[j] for row in increase)]
    if used:
        lo, hi = min(used), max(used)
        grid = [[row[j] for row in increase] for j in range(lo, hi + 1)]
        heat_ax.imshow(grid, aspect="auto", origin="lower", cmap="Oranges",
                       extent=(xs[0], xs[-1], -0.5, hi - lo + 0.5), interpolation="nearest")
        heat_ax.set_yticks(range(hi - lo + 1))
        heat_ax.set_yticklabels([f"≤ {_le(b)} s" for b in bounds[lo:hi + 1]], fontsize=7)
    heat_ax.set_title("Delivery lateness (ladder_delivery_lateness_seconds, per 2 s)")
    for reason in REASONS:
        values = series(scrapes, f"ladder_parked_total{{reason={reason}}}")
        park_ax.plot(xs, values, label=reason, drawstyle="steps-post")
    park_ax.set_title("Parked by reason (ladder_parked_total)")
    park_ax.legend(loc="upper left", fontsize=8)
    for ax in axes.flat:
        ax.set_xlabel("seconds")
    fig.suptitle(f"A kombu-ladder relay's /metrics, scraped every {SCRAPE_EVERY:g} s: {PUBLISH_FOR:g} s of "
                 f"1-60 s delays at 20/s, then {DRAIN_FOR:g} s to drain "
                 f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))})", fontsize=10)
    fig.savefig(out, dpi=90)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def main() -> None:
    scrapes = run()
    os.makedirs(os.path.dirname(SCRAPES), exist_ok=True)
    with open(SCRAPES, "w") as sink:
        json.dump(scrapes, sink)
    plot(scrapes)
    log(f"{len(scrapes)} scrapes; wrote {OUT} and {SCRAPES}")


if __name__ == "__main__":
    main()
