"""Issue 14's benchmark figures that need no broker: round delays on the simulator, and how the page shows
the burst, the relay's CPU per message and the round-delay table."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives at the repository root

from bench.common import Config, summarize  # noqa: E402
from bench.report import render  # noqa: E402
from bench.rounds import fewest_on_time, one, within  # noqa: E402

DAY = 86_400


@pytest.mark.parametrize("delay_ms,lag_ms,expected", [
    (120_000, 3, 2),          # 60 + 60, 6 ms late
    (3_600_000, 3, 1),
    (14_400_000, 3, 4),       # 12 ms late
    (86_400_000, 3, 42),      # 24 one-hour hops are 72 ms late: the last hour must be walked down
    (86_400_000, 2, 24),      # 48 ms late
    (86_400_000, 0, 24),
    (75_000, 3, 2),           # 60 + 10, then held
])
def test_fewest_placements_of_any_plan_on_time(delay_ms: int, lag_ms: int, expected: int) -> None:
    assert fewest_on_time(delay_ms, lag_ms, 10_000) == expected


@pytest.mark.parametrize("delay,placements,lateness_ms", [(120, 2, 6.0), (3600, 1, 3.0), (4 * 3600, 4, 12.0)])
def test_round_delays_on_the_simulator(delay: int, placements: int, lateness_ms: float) -> None:
    row = one(delay)
    assert (row["placements"], row["theory"], row["lateness_ms"]) == (placements, placements, lateness_ms)
    assert row["relay_hops"] == placements - 1
    assert within(row) == (True, True)


def _page(results: dict[str, Any]) -> str:
    env = {"python": "3.11", "celery": "5.7.0", "kombu": "5.7.0", "amqp": "5.4.2", "rabbitmq": "3.10.8",
           "cores": 2, "memory_gb": 24.0, "cpu": "test", "os": "Linux"}
    meta = {"config": "full", "sizes": asdict(Config.full()), "environment": env, "command": "make bench",
            "started": "2026-12-01 15:00", "finished": "2026-12-01 15:20", "duration_s": 1200.0,
            "load_start": "1", "load_end": "2"}
    return render(results, meta, None)


def _contender(name: str, values: list[float], **extra: Any) -> dict[str, Any]:
    summary = summarize(values, len(values))
    summary.update(extra)
    return {"name": name, "lateness": values, "summary": summary}


def test_the_page_shows_the_burst_the_relay_cpu_and_the_round_delays() -> None:
    rows = [{"delay_s": 120, "lag_ms": 3, "theory": 2, "placements": 2, "rungs": {"60": 2}, "relay_hops": 1,
             "lateness_ms": 6.0, "fewest_on_time": 2, "real_s": 0.1},
            {"delay_s": DAY, "lag_ms": 3, "theory": 24, "placements": 24, "rungs": {"3600": 24}, "relay_hops": 23,
             "lateness_ms": 72.0, "fewest_on_time": 42, "real_s": 2.0}]
    page = _page({
        "lateness": {
            "b": _contender("(b) kombu_ladder", [-1.0, 2.0, 9.0], hops_per_message=1.4,
                            relay_cpu_us_per_message=812.0),
            "burst": _contender("(b) kombu_ladder, burst: 3 due in one second", [1.0, 30.0, 80.0],
                                hops_per_message=1.0, relay_cpu_us_per_message=700.0),
        },
        "rounds": {"lag_ms": 3, "hold_window_s": 10.0, "rows": rows},
    })
    assert "| 812 µs |" in page and "| 700 µs |" in page
    assert "**Burst.**" in page
    assert "| burst: 3 kombu messages due within one second, p99 ≤ 50 ms | p99 79.0 ms" in page
    assert "**Missed: burst p99 ≤ 50 ms**" in page
    assert "## 7. Round delays with a lagging broker" in page
    assert "| 86,400 s | 24 (24) | 24 × 1 h | 23 | 72.0 ms | 42 | **missed**: lateness |" in page
    assert "120 s: 2 (2); 86,400 s: 24 (24) | met |" in page
    assert "**Missed: round delays, lateness for countdown=86,400**" in page
    assert "the fewest placements that arrive no more than 50 ms late are 42" in page
