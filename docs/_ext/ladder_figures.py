"""Sphinx directives that build the docs' tables from the code, so a figure on a page cannot drift from it.

``.. ladder-hops::`` renders relay hops per delivered message from
:func:`kombu_ladder.plan.forecast`; ``:hops:`86400``` is one of its figures in a
sentence. ``.. ladder-metrics::`` renders every metric a relay serves, read from
:class:`kombu_ladder.metrics.LadderCollector` itself. ``.. fault-figures::`` renders the fault
suite's figures from ``docs/_data/fault-figures.json``, which every run of the suite merges into.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives

__all__ = ["setup", "relay_hops", "metric_rows", "fault_rows", "HOPS_LAG_MS", "HOPS_DELAYS", "FAULT_FIGURES"]

#: Each rung's expiry, in ms after its TTL, in the hops table (RabbitMQ's median is a few ms).
HOPS_LAG_MS = 5

#: The delays of the hops table, in seconds.
HOPS_DELAYS = (1, 5, 30, 90, 600, 3600, 4 * 3600, 86400, 7 * 86400)


def relay_hops(delay_s: int, *, lag_ms: int = HOPS_LAG_MS) -> int:
    """Relay hops of one message delayed ``delay_s`` seconds, every expiry ``lag_ms`` late, the default hold window."""
    from kombu_ladder.plan import HOLD_WINDOW, forecast

    rungs, _ = forecast(delay_s * 1000, lag_ms=lag_ms, hold_window_ms=round(HOLD_WINDOW * 1000))
    return len(rungs) - 1  # the producer's placement is not a hop


def _label(seconds: int) -> str:
    for unit, size in (("days", 86400), ("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0 and (unit != "days" or seconds > size):
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _table(header: list[str], rows: list[list[Any]], widths: list[int]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)

    def row(cells: list[Any]) -> nodes.row:
        out = nodes.row()
        for cell in cells:
            entry = nodes.entry(classes=["text-right"] if isinstance(cell, int) else [])
            entry += nodes.paragraph("", "", *(cell if isinstance(cell, list) else [nodes.Text(str(cell))]))
            out += entry
        return out

    head = nodes.thead()
    head += row(header)
    body = nodes.tbody()
    for cells in rows:
        body += row(cells)
    group += head
    group += body
    return table


class HopsTable(Directive):
    """``.. ladder-hops::``: relay hops per delivered message for :data:`HOPS_DELAYS`."""

    has_content = False
    option_spec = {"lag-ms": directives.nonnegative_int}

    def run(self) -> list[nodes.Node]:
        lag = self.options.get("lag-ms", HOPS_LAG_MS)
        return [_table(["delay", *(_label(d) for d in HOPS_DELAYS)],
                       [["relay hops", *(relay_hops(d, lag_ms=lag) for d in HOPS_DELAYS)]],
                       [14] + [8] * len(HOPS_DELAYS))]


def hops_role(name: str, rawtext: str, text: str, lineno: int, inliner: Any, options: Any = None,
              content: Any = None) -> tuple[list[nodes.Node], list[nodes.Node]]:
    """``:hops:`86400```: the relay hops of that delay, as in the hops table."""
    return [nodes.Text(f"{relay_hops(int(text)):,}")], []


def metric_rows() -> list[tuple[str, str, str]]:
    """``(metric, type, help)`` for every family a relay's and a Celery worker's ``/metrics`` serve (the help of
    a metric only Celery workers serve says so)."""
    from kombu_ladder.depths import LADDER_QUEUES, QueueDepth
    from kombu_ladder.metrics import LadderCollector
    from kombu_ladder.relay import Counters

    class Sampled:  # a sampler that has sampled every ladder queue once
        depths = tuple(QueueDepth(queue, 0, 0) for queue in LADDER_QUEUES)
        sampled_at = 0.0
        errors = 0

    def enforcing() -> bool:
        return True

    relay = {f.name for f in LadderCollector(Counters(), Sampled(), enforcing=enforcing).collect()}  # type: ignore
    rows = []
    celery = LadderCollector(Counters(), Sampled(), extra=lambda: {"scheduled": 0}, enforcing=enforcing)  # type: ignore
    for family in celery.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = sorted({key for sample in family.samples for key in sample.labels if key != "le"})
        if labels:
            name += "{" + ",".join(labels) + "}"
        text = family.documentation if family.name in relay else f"Celery workers only. {family.documentation}"
        for label in labels:
            seen = list(dict.fromkeys(s.labels[label] for s in family.samples))
            every_queue = set(seen) == set(LADDER_QUEUES) and "each ladder queue" in text
            if not every_queue and not all(value in text for value in seen):  # unless the help names them
                text += f" ({label}: {', '.join(seen)})"
        rows.append((name, family.type, text))
    return rows


class MetricsTable(Directive):
    """``.. ladder-metrics::``: every metric the relays serve, with its type and help text."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        rows = [[[nodes.literal(name, name)], kind, text] for name, kind, text in metric_rows()]
        return [_table(["metric", "type", "meaning"], rows, [38, 10, 52])]


def shown(default: Any) -> str:
    """A default as the reference shows it: strings in double quotes, whole seconds as integers."""
    if isinstance(default, str):
        return f'"{default}"'
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return repr(default)


def settings_rst() -> list[str]:
    """The reference of every relay option, from :data:`kombu_ladder.tuning.TUNABLES`: one entry each, under
    its Celery setting name, with its Django name, default, bounds, Python keyword, flag and variable."""
    from kombu_ladder.tuning import TUNABLES

    lines: list[str] = []
    for t in TUNABLES.values():
        accepted = {"seconds": f"{t.bounds()} seconds, or a duration (``10m``, ``2h30m``)",
                    "count": f"a whole number {t.bounds()}"}.get(t.kind, t.bounds())
        lines += [f"``{t.setting}``",
                  f"    :Django name: ``CELERY_{t.setting.upper()}``",
                  f"    :Default: ``{shown(t.default)}``",
                  f"    :Accepted: {accepted}",
                  f"    :Python: ``{t.name}=`` (:class:`~kombu_ladder.relay.RelayOptions`; ``Scheduler.on``, ``Relay``)",
                  f"    :Command line: ``relay {t.option}`` (environment: ``KOMBU_LADDER_{t.name.upper()}``)",
                  "", f"    {t.help}", ""]
    return lines


class SettingsReference(Directive):
    """``.. ladder-settings::``: the relay options' reference (:func:`settings_rst`), so that it cannot drift."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from docutils.statemachine import StringList

        node = nodes.container()
        self.state.nested_parse(StringList(settings_rst(), source="kombu_ladder/tuning.py"), self.content_offset,
                                node)
        return list(node.children)


#: The fault suite's figures per test (tests/faults/figures_record.py writes it).
FAULT_FIGURES = Path(__file__).resolve().parents[1] / "_data" / "fault-figures.json"


def fault_rows(scenarios: list[tuple[str, str]], path: Path = FAULT_FIGURES) -> list[list[str]]:
    """``[label, sent, delivered, duplicated, lost, runs]`` per ``(test id, label)``: each count as its min–max
    over the runs ``path`` records (one figure when they agree). A test the file does not have raises KeyError."""
    data = json.loads(path.read_text(encoding="utf-8"))["scenarios"]

    def span(low: int, high: int) -> str:
        return f"{low:,}" if low == high else f"{low:,}–{high:,}"

    return [[label, *(span(*data[test][k]) for k in ("sent", "delivered", "duplicated", "lost")),
             str(data[test]["runs"])] for test, label in scenarios]


class FaultFigures(Directive):
    """``.. fault-figures::``: the fault suite's figures per scenario. The content lists the scenarios: a test's
    node id (``tests/faults/...::test_...``) on a line, its label (reStructuredText) indented below it."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        from docutils.statemachine import StringList

        scenarios: list[tuple[str, str]] = []
        for line in self.content:
            if line.strip() and not line[0].isspace():
                scenarios.append((line.strip(), ""))
            elif line.strip() and scenarios:
                scenarios[-1] = (scenarios[-1][0], f"{scenarios[-1][1]} {line.strip()}".strip())
            elif line.strip():
                raise self.error(f"fault-figures: {line.strip()!r} comes before any test id")
        try:
            rows = fault_rows(scenarios)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise self.error(f"fault-figures: no figures in {FAULT_FIGURES} for this table: {exc!r}") from exc
        self.state.document.settings.env.note_dependency(str(FAULT_FIGURES))
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 40 10 10 10 8 8", ""]
        for row in [["scenario", "sent", "delivered", "duplicated", "lost", "runs"], *rows]:
            lines += [f"   * - {row[0]}", *(f"     - {cell}" for cell in row[1:])]
        node = nodes.container()
        self.state.nested_parse(StringList(lines, source=str(FAULT_FIGURES)), self.content_offset, node)
        return list(node.children)


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("ladder-settings", SettingsReference)
    app.add_directive("ladder-hops", HopsTable)
    app.add_directive("ladder-metrics", MetricsTable)
    app.add_directive("fault-figures", FaultFigures)
    app.add_role("hops", hops_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
