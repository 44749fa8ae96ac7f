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
        "relay": {"ratio": 0.95, "ratio_of_medians": 0.94, "ratio_per_repeat": [0.95],
                  "summary": {"rawx1": {"median": 2000.0, "rates": [2000.0], "cpu_us_per_hop": 280.0},
                              "oursx1": {"median": 1900.0, "rates": [1900.0], "cpu_us_per_hop": 300.0},
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
    assert "**Missed: `LadderProducer.publish(countdown=3600)` ≥ 0.9×** (0.50×)" in page
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
