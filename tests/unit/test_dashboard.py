"""The Grafana dashboard and the documented alert rules query only metrics that the relays export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kombu_ladder.depths import LADDER_QUEUES, QueueDepth
from kombu_ladder.metrics import LadderCollector
from kombu_ladder.relay import Counters
from kombu_ladder.sampler import QueueSampler

DOCS = Path(__file__).resolve().parents[2] / "docs"
DASHBOARD = DOCS / "grafana" / "ladder.json"


def exported() -> set[str]:
    """Every sample name a relay's /metrics has (with a queue sample and one delivery)."""
    sampler = QueueSampler(None)
    sampler.depths = tuple(QueueDepth(q, 1, 1) for q in LADDER_QUEUES)
    sampler.sampled_at = 1.0
    counters = Counters()
    counters.count_delivered(0.001)
    registry = CollectorRegistry()
    registry.register(LadderCollector(counters, sampler))
    return {s.name for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}


def expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\bladder_[a-z_]+\b", expr))


def test_the_dashboard_loads_and_shows_what_the_issue_asks() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Rung depths", "Deliveries and hops per second", "Delivery lateness", "Parked by reason"} <= titles
    assert {p["type"] for p in dashboard["panels"] if p["title"] == "Delivery lateness"} == {"heatmap"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    queried = set().union(*(metrics_in(e) for e in expressions(json.loads(DASHBOARD.read_text()))))
    assert queried, "the dashboard queries no ladder metric"
    assert sorted(queried - exported()) == []


def test_every_metric_the_documented_alert_rules_query_is_exported() -> None:
    page = (DOCS / "operations.rst").read_text()
    rules = re.findall(r"expr: (.+)", page)
    assert len(rules) >= 4, "operations.rst has the example alert rules"
    queried = set().union(*(metrics_in(rule) for rule in rules))
    assert sorted(queried - exported()) == []
