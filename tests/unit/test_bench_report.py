"""The benchmark harness's pure parts: statistics, the report's verdicts and closing note, the plot."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives at the repository root

from bench.common import Config, payload, percentile, summarize  # noqa: E402
from bench.report import ms, render  # noqa: E402


@pytest.mark.parametrize("values,q,expected", [
    ([1, 2, 3, 4, 5], 50, 3),
    ([5, 1, 4, 2, 3], 0, 1),
    ([5, 1, 4, 2, 3], 100, 5),
    ([0, 10], 99, 9.9),
])
def test_percentile_interpolates(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_summarize_counts_early_and_late() -> None:
    s = summarize([-900.0, -1.0, 0.0, 49.0, 51.0, 1500.0], expected=8)
    assert (s["arrived"], s["expected"]) == (6, 8)
    assert (s["early"], s["late_50ms"], s["late_1s"]) == (2, 2, 1)
    assert (s["min"], s["max"]) == (-900.0, 1500.0)


def test_summarize_with_nothing_arrived() -> None:
    s = summarize([], expected=3)
    assert s["arrived"] == 0 and s["p50"] is None and s["early"] == 0


def test_payload_size_and_content() -> None:
    body = payload(7, 1234)
    assert 590 <= len(body) <= 610
    assert b'"i": 7' in body and b'"due": 1234' in body


@pytest.mark.parametrize("given,expected", [(None, "–"), (3.14159, "3.1"), (-998.4, "-998"), (74512.2, "74,512")])
def test_ms_format(given: float, expected: str) -> None:
    assert ms(given) == expected


def _lateness(name: str, values: list[float], n: int, **extra: Any) -> dict[str, Any]:
    summary = summarize(values, n)
    summary.update(extra)
    return {"name": name, "lateness": values, "summary": summary}


#: The publish comparisons, as bench.publish.PAIRS names them.
PLAIN, LADDER = "Producer.publish", "LadderProducer.publish(countdown=3600)"
VANILLA, CELERY = "vanilla apply_async(countdown=3600)", "ladder apply_async(countdown=3600)"


def _results(*, publish_ratio: float, d_p99_ms: float) -> dict[str, Any]:
    return {
        "lateness": {
            "a": _lateness("(a) per-message TTL", [5.0, 20_000.0, 40_000.0], 3),
            "b": _lateness("(b) kombu_ladder", [-3.0, 1.0, 20.0], 3, hops_per_message=1.5, max_backlog=0,
                           max_backlog_at_s=0.0),
            "c": _lateness("(c) vanilla Celery ETA", [1.0, 2.0, 3.0], 3),
            "d": _lateness("(d) Celery with the ladder", [1.0, 2.0, d_p99_ms], 3),
            "e": _lateness("(e) Celery native delayed delivery", [1.0, 2.0, 3.0], 3),
        },
        "footprint": {
            "vanilla": {"n": 100, "publish_per_s": 900.0, "rss_growth_kb": 2048, "unacked": 60,
                        "plain_wait_ms": None, "still_waiting_after_s": 20,
                        "samples": [{"t": 0.0, "unacked": 10}, {"t": 10.0, "unacked": 60}]},
            "ladder": {"n": 100, "publish_per_s": 800.0, "rss_growth_kb": 0, "unacked": 0, "plain_wait_ms": 4.0,
                       "still_waiting_after_s": None, "samples": []},
        },
        "relay": {"ratio": 1.05, "ratio_of_medians": 1.05, "ratio_per_repeat": [1.05],
                  "cpu_ratio": 1.12, "cpu_ratio_per_repeat": [1.12],
                  "summary": {"rawx1": {"median": 2000.0, "rates": [2000.0], "cpu_us_per_hop": 280.0},
                              "oursx1": {"median": 2100.0, "rates": [2100.0], "cpu_us_per_hop": 250.0},
                              "oursx2": {"median": 2500.0, "rates": [2500.0], "cpu_us_per_hop": 320.0}}},
        "publish": {"rates": {PLAIN: [1000.0], LADDER: [1000 * publish_ratio], VANILLA: [500.0], CELERY: [480.0]},
                    "medians": {PLAIN: 1000.0, LADDER: 1000 * publish_ratio, VANILLA: 500.0, CELERY: 480.0},
                    "ratios": {LADDER: publish_ratio, CELERY: 0.96},
                    "paired_ratios": {LADDER: [publish_ratio], CELERY: [0.96]}},
    }


def _meta(config: Config) -> dict[str, Any]:
    from dataclasses import asdict

    env = {"python": "3.11", "celery": "5.7.0", "kombu": "5.7.0", "amqp": "5.4.2", "rabbitmq": "3.10.8",
           "cores": 2, "memory_gb": 24.0, "cpu": "test", "os": "Linux"}
    return {"config": config.name, "sizes": asdict(config), "environment": env, "command": "make bench",
            "started": "2026-11-30 04:00", "finished": "2026-11-30 04:20", "duration_s": 1200.0,
            "load_start": "load average: 1", "load_end": "load average: 2"}


def test_render_all_targets_met() -> None:
    page = render(_results(publish_ratio=0.95, d_p99_ms=10.0), _meta(Config.full()), "_static/lateness.png")
    assert page.startswith("(benchmarks)=\n# Benchmarks")
    assert "**missed**" not in page
    assert "Every target was met in this run." in page
    assert "![Lateness CDF per contender](_static/lateness.png)" in page
    assert "This page holds a `quick` run" not in page
    assert "**still waiting after 20 s**" in page


def test_render_reports_misses_with_why() -> None:
    page = render(_results(publish_ratio=0.5, d_p99_ms=80.0), _meta(Config.quick()), None)
    assert "This page holds a `quick` run" in page
    assert "| publish: `LadderProducer.publish(countdown=3600)` ≥ 0.9× its baseline | 0.50× | **missed** |" in page
    assert "**Missed: `LadderProducer.publish(countdown=3600)` ≥ 0.9×** (0.50×, per round 0.50)" in page
    assert "**Missed: (d) p99 ≤ 20 ms**" in page
    assert "Every target was met" not in page


@pytest.mark.process
def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench.plot import plot_lateness

    results = _results(publish_ratio=1.0, d_p99_ms=5.0)["lateness"]
    path = plot_lateness(results, str(tmp_path / "lateness.png"), title="test")
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_celery_panel_ends_past_the_ladder_and_native_tasks_not_at_vanilla_etas_tail() -> None:
    from bench.plot import celery_window_ms

    def contender(values: list[float]) -> dict[str, Any]:
        return {"name": "x", "lateness": values, "summary": {"expected": len(values)}}

    fast = [1.0 + i / 100 for i in range(100)]  # 1.00 .. 1.99 ms
    slow_tail = [*fast[:-5], 3000.0, 3500.0, 3900.0, 3950.0, 4000.0]
    window = celery_window_ms({"c": contender(slow_tail), "d": contender([*fast[:-1], 30.0]),
                               "e": contender(fast)})
    assert window == pytest.approx(30.0 * 1.2)  # d's slowest start, not c's seconds
    assert celery_window_ms({"d": contender(fast)}) == pytest.approx(10.0)  # at least 10 ms


def _burst(shape: str, kind: str, relays: int, rate: float, early: int = 0, **extra: Any) -> dict[str, Any]:
    return {"shape": shape, "kind": kind, "relays": relays, "expected": 1000, "arrived": 1000, "first": -900.0 if early
            else 2.0, "p50": 500.0, "p99": 2_000.0, "last": 3_000.0, "early": early, "rate": rate,
            "ratio": rate / 20_000, "raw_ratio": rate / 1_000, "relay_cpu_us": 250.0, "broker_cpu_us": 90.0,
            "publish_to_due_s": 20.0, **extra}


def _bursts(*, single: float, twins: float, early: int) -> dict[str, Any]:
    rounds = [_burst(shape, kind, relays, (single if shape == "distinct" else single * twins) * relays ** 0.5,
                     early if (shape, kind, relays) == ("distinct", "standalone", 1) else 0)
              for shape in ("distinct", "identical") for kind in ("standalone", "worker") for relays in (1, 2, 4)]
    return {"n": 1000, "size": 200, "lead_s": 16.0, "broker_only_rate": 20_000.0, "rounds": rounds,
            "broker_only": [{"rate": 19_000.0}, {"rate": 21_000.0}], "raw_loop_rate": 1_000.0,
            "raw_loop": [{"rate": 900.0, "cpu_us": 150.0}, {"rate": 1_100.0, "cpu_us": 160.0}]}


def _waiting() -> dict[str, Any]:
    snap = {"node_memory": 200 * 2**20, "vhost_messages": 0, "vhost_queue_memory": 2**20,
            "vhost_message_bytes_ram": 0, "vhost_disk": 2**16}
    loaded = {**snap, "node_memory": 500 * 2**20, "vhost_messages": 100_000, "vhost_disk": 300 * 2**20}
    run = {"broker": "3.10.8", "n": 100_000, "relays": 4, "profile": "classic queues, ladder-lazy policy",
           "before": snap, "loaded": loaded, "publish_per_s": 5_000.0, "publish_cpu_us": 45.0, "arrived": 100_000,
           "drain_s": 30.0, "drain_per_s": 3_333.0, "early": 0}
    return {"n": 100_000, "relays": 4, "brokers": [run, {"broker": "4.0.5", "error": "RuntimeError: gone"}]}


def test_render_bursts_and_waiting_met() -> None:
    results = {**_results(publish_ratio=0.95, d_p99_ms=10.0), "bursts": _bursts(single=7_000, twins=1.0, early=0),
               "waiting": _waiting()}
    page = render(results, _meta(Config.full()), None)
    assert "## 8. Bursts" in page and "## 9. A million waiting on one node" in page
    assert "| bursts: one relay delivers ≥ 0.3× the broker's own dead-letter rate | standalone 0.35× (7,000/s), " \
           "worker 0.35× (7,000/s) | met |" in page
    # one round, in the two tables (twelve columns in one would be wider than the page's text column)
    assert "| distinct | 1 × `kombu-ladder relay` | 1,000/1,000 | 2.0 | 500 | 2,000 | 3,000 | 0 |\n" in page
    assert "| distinct | 1 × `kombu-ladder relay` | 7,000 | **0.35×** | 7.00× | 250 µs | 90 µs |\n" in page
    assert "Their median, **20,000/s**, is 1× below." in page
    assert ("**A raw py-amqp loop** (consume, republish unchanged with pipelined confirms, ack with `multiple`) "
            "moving 1,000 such messages, waiting in the control queue, to the same consumer: 900/s (150 µs of CPU "
            "per message) before the rounds, 1,100/s (160 µs of CPU per message) after them") in page
    assert ("| bursts: one relay delivers ≥ 0.9× a raw py-amqp loop's rate on the same burst | standalone 7.00× "
            "(7,000 vs 1,000/s), worker 7.00× (7,000 vs 1,000/s) | met |") in page
    assert ("| relay: CPU per hop ≤ the raw loop's (its CPU over ours, median of paired repeats ≥ 1.0×) | 1.12× "
            "(250 vs 280 µs) | met |") in page
    assert "(**+300 MB**)" in page and "**300 MB**" in page and "failed: RuntimeError: gone" in page
    assert "- **What a burst costs.** 1,000 distinct messages due in the same second" in page
    assert "Every target was met in this run." in page


def test_render_bursts_misses_say_what_bounds_them() -> None:
    results = {**_results(publish_ratio=0.95, d_p99_ms=10.0), "bursts": _bursts(single=3_000, twins=0.5, early=7)}
    page = render(results, _meta(Config.quick()), None)
    assert "| bursts: 1,000 due in one second, none early (every shape, kind and relay count) | 7 early, " \
           "12,000 of 12,000 arrived | **missed** |" in page
    assert "**Missed: bursts, none early** (distinct 1 × standalone: 7 early, the first -900 ms)" in page
    assert "**Missed: one standalone relay ≥ 0.3× the broker alone** (0.15×" in page
    assert "the relays' CPU per delivered message (hops included) was 250 µs and the broker's 90 µs" in page
    assert "**Missed: identical messages ≥ 0.9× as fast as distinct ones** (1 × standalone: 0.50×" in page
    assert "The relays did no more work per identical message, so the gap is not theirs" in page


@pytest.mark.parametrize("unsent,says", [
    (20.0, "Before sending the ladder is within the target"),
    (40.0, "The ladder's own work before sending is the bound"),
    (55.0, "the run cannot split the two"),
])
def test_a_publish_miss_says_what_bounds_it_from_the_run_s_own_split(unsent: float, says: str) -> None:
    results = _results(publish_ratio=0.8, d_p99_ms=10.0)
    results["publish"].update(cpu_us={PLAIN: 40.0, LADDER: 50.0, VANILLA: 300.0, CELERY: 310.0},
                              unsent_cpu_us={PLAIN: 19.0, LADDER: unsent, VANILLA: 250.0, CELERY: 255.0})
    page = render(results, _meta(Config.full()), None)
    assert f"| `{LADDER}` | 800 | 800 | **0.80×** (per round: 0.80) | 50.0 µs | {unsent:.1f} µs |" in page
    assert (f"50.0 µs per publish against 40.0 µs for `{PLAIN}`; before sending (the properties encoded, nothing "
            f"framed or sent) {unsent:.1f} µs against 19.0 µs ({19 / unsent:.2f}×).") in page
    assert says in page


def test_the_readme_says_what_a_burst_costs_in_the_page_s_own_words() -> None:
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (paragraph,) = [p for p in readme.split("\n\n") if p.startswith("**What a burst costs.**")]
    words = re.findall(r"\*([^*]+)\*", paragraph.replace("**What a burst costs.**", ""))
    assert len(words) >= 7 and not re.search(r"\d[\d,.]*\s*(ms|/s|×|MB|GB)", paragraph)  # words, no figures
    results = {**_results(publish_ratio=0.95, d_p99_ms=10.0), "bursts": _bursts(single=7_000, twins=1.0, early=0),
               "waiting": _waiting()}
    page = render(results, _meta(Config.full()), None).lower()
    for word in words:
        assert " ".join(word.lower().split()) in page, word


def test_a_burst_that_kept_up_with_its_due_times_is_not_read_as_slow() -> None:
    bursts = _bursts(single=1_000, twins=1.0, early=0)
    for r in bursts["rounds"]:
        r.update(last=40.0, kept_up=True)
    page = render({**_results(publish_ratio=0.95, d_p99_ms=10.0), "bursts": bursts}, _meta(Config.quick()), None)
    assert "standalone 0.05× (1,000/s, kept up with the due times)" in page
    assert "**0.05×** (kept up)" in page
    assert "Missed: one" not in page and "Every target was met in this run." in page


def test_a_relay_start_after_a_year_of_revokes_is_a_row_and_a_target() -> None:
    cancellations = {"memory": {"n": 1_000, "mib": 0.2, "bytes_per_id": 207.8},
                     "start": {"n": 1_000, "seconds": 0.06, "records_per_s": 16_842},
                     "hops": {"live": 100, "hops_per_s_none": 4_000, "hops_per_s_live": 4_100, "ratio": 1.025}}
    base = _results(publish_ratio=0.95, d_p99_ms=10.0)
    page = render({**base, "cancellations": cancellations}, _meta(Config.full()), None)
    assert "records ever written" not in page and "a relay starts within 2 s" not in page  # a run without it
    for seconds, verdict in ((1.42, "met"), (2.5, "**missed**")):
        bounded = {"old": 990_000, "live": 10_000, "seconds": seconds, "kept": 10_000}
        page = render({**base, "cancellations": {**cancellations, "bounded": bounded}}, _meta(Config.full()), None)
        assert (f"| relay start, 1,000,000 records ever written, 10,000 of them within its read-back | {seconds} s "
                f"(10,000 live kept) |") in page
        assert (f"| cancellations: a relay starts within 2 s with 1,000,000 records ever written, 10,000 live | "
                f"{seconds} s | {verdict} |") in page
