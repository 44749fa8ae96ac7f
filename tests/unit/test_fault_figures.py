"""The guarantees page's "Measured" table is the fault suite's figures file, and every run merges into that file.

``tests/faults/figures_record.py`` merges a run's figures (the ``report`` fixture's) into
``docs/_data/fault-figures.json``; the page's ``.. fault-figures::`` directive renders that
file. Here with fake reports, no broker: the merge, the suite's hook (which must never fail
or skip the suite), and that the page's scenarios are tests of the suite the file has.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from docs_blocks import ROOT
from faults import conftest as faults_conftest
from faults.figures_record import DATA, merge, record

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
from ladder_figures import FAULT_FIGURES, fault_rows  # noqa: E402  (docs/_ext)

KILL = "tests/faults/test_relay_crash.py::test_relay_killed_twice_loses_nothing"
RESTART = "tests/faults/test_broker_restart.py::test_standalone_relay_reconnects_after_broker_restart[restart]"


def entry(test: str, sent: int, duplicated: int, **more: Any) -> dict[str, Any]:
    return {"test": test, "sent": sent, "delivered": sent, "duplicated": duplicated, "lost": 0, **more}


def seeded(tmp_path: Path) -> Path:
    path = tmp_path / "fault-figures.json"
    path.write_text(json.dumps({"about": "seed", "scenarios": {KILL: {
        "sent": [5000, 5000], "delivered": [5000, 5000], "duplicated": [18, 47], "lost": [0, 0], "runs": 2,
        "releases": []}}}))
    return path


def test_a_run_widens_the_ranges_and_counts_only_the_tests_that_passed(tmp_path: Path) -> None:
    path = seeded(tmp_path)
    entries = [entry(KILL, 5000, 52, kills=2), entry(RESTART, 1000, 0),
               entry("tests/faults/test_x.py::test_failed", 5, 3),  # failed: not a figure of the guarantees
               {"test": "tests/faults/test_index_restart.py::test_i[restart]", "indexed": 420}]  # no counts
    line = record(entries, {KILL, RESTART, "tests/faults/test_index_restart.py::test_i[restart]"}, "3.10.7", path)
    assert line == f"merged 2 test(s)' figures into {path}"
    scenarios = json.loads(path.read_text())["scenarios"]
    assert scenarios[KILL] == {"sent": [5000, 5000], "delivered": [5000, 5000], "duplicated": [18, 52],
                               "lost": [0, 0], "runs": 3, "releases": ["3.10.7"]}
    assert scenarios[RESTART] == {"sent": [1000, 1000], "delivered": [1000, 1000], "duplicated": [0, 0],
                                  "lost": [0, 0], "runs": 1, "releases": ["3.10.7"]}
    assert set(scenarios) == {KILL, RESTART}
    record([entry(KILL, 5000, 20)], {KILL}, "4.3.6", path)
    assert json.loads(path.read_text())["scenarios"][KILL]["duplicated"] == [18, 52]
    assert json.loads(path.read_text())["scenarios"][KILL]["releases"] == ["3.10.7", "4.3.6"]
    assert json.loads(path.read_text())["about"] == "seed"


def test_a_run_without_figures_leaves_the_file_alone(tmp_path: Path) -> None:
    path = seeded(tmp_path)
    before = path.read_text()
    assert record([entry(KILL, 5000, 60)], set(), "", path) == f"no figures to merge into {path}"
    assert path.read_text() == before


@pytest.mark.parametrize("content", ["{not json", "[]", json.dumps({"scenarios": {KILL: {"sent": 5000}}}),
                                     json.dumps({"scenarios": []})])
def test_a_malformed_file_is_left_as_it_was_and_nothing_raises(tmp_path: Path, content: str) -> None:
    path = tmp_path / "fault-figures.json"
    path.write_text(content)
    line = record([entry(KILL, 5000, 20)], {KILL}, "", path)
    assert line.startswith(f"figures not merged into {path}: "), line
    assert path.read_text() == content
    assert not list(tmp_path.glob("*.tmp"))


def test_an_unwritable_place_does_not_raise(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert record([entry(KILL, 5000, 20)], {KILL}, "", blocked / "fault-figures.json").startswith(
        "figures not merged")


def test_merge_leaves_its_input_alone() -> None:
    data = {"scenarios": {}}
    assert merge(data, [entry(KILL, 5, 0)], {KILL})["scenarios"][KILL]["runs"] == 1
    assert data == {"scenarios": {}}


class FakeReporter:
    """What pytest_terminal_summary uses of pytest's terminal reporter."""

    def __init__(self, passed: list[str], failed: list[str]) -> None:
        self.stats = {"passed": [SimpleNamespace(nodeid=n, when="call") for n in passed],
                      "failed": [SimpleNamespace(nodeid=n, when="call") for n in failed]}
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


@pytest.mark.parametrize("malformed", [False, True])
def test_the_suites_summary_merges_the_passed_tests_and_never_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, malformed: bool) -> None:
    path = seeded(tmp_path)
    if malformed:
        path.write_text("{")
    monkeypatch.setattr(faults_conftest, "DATA", path)
    monkeypatch.setattr(faults_conftest, "FIGURES_DIR", tmp_path / "build")
    monkeypatch.setattr(faults_conftest, "_figures", [entry(KILL, 5000, 60), entry(RESTART, 1000, 1)])
    monkeypatch.setattr(faults_conftest, "_release", ["3.10.7"])
    reporter = FakeReporter(passed=[KILL], failed=[RESTART])
    faults_conftest.pytest_terminal_summary(reporter)
    assert (tmp_path / "build" / "fault-figures.txt").read_text().count("\n") == 3  # both tests, as before
    if malformed:
        assert path.read_text() == "{"
        assert any(line.startswith("figures not merged") for line in reporter.lines), reporter.lines
    else:
        assert f"merged 1 test(s)' figures into {path}" in reporter.lines
        assert set(json.loads(path.read_text())["scenarios"]) == {KILL}
        assert json.loads(path.read_text())["scenarios"][KILL]["duplicated"] == [18, 60]


def page_scenarios() -> list[tuple[str, str]]:
    """The ``(test id, label)`` pairs of the guarantees page's ``.. fault-figures::`` table."""
    text = (ROOT / "docs" / "guarantees.rst").read_text()
    block = re.search(r"^\.\. fault-figures::\n\n((?:   .*\n|\n)+)", text, re.M)
    assert block, "docs/guarantees.rst has no fault-figures table"
    ids = re.findall(r"^   (tests/faults/\S+)$", block.group(1), re.M)
    return [(i, "") for i in ids]


def test_the_page_shows_tests_of_the_suite_that_the_file_has() -> None:
    """The table's rows are figures of tests that exist (a renamed test would leave its figures stale)."""
    assert DATA == FAULT_FIGURES
    scenarios = page_scenarios()
    assert len(scenarios) == 10
    assert len(fault_rows(scenarios)) == len(scenarios)  # a KeyError if the file lacks one (the docs build fails)
    for test, _ in scenarios:
        path, name = test.split("::")
        function, _, param = name.partition("[")
        source = (ROOT / path).read_text()
        assert function in {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}, test
        assert not param or repr(param.rstrip("]")).strip("'") in source, test


def test_the_table_is_the_file(tmp_path: Path) -> None:
    """A count's range is shown as the file has it, so a new run shows on the page at the next build."""
    path = seeded(tmp_path)
    assert fault_rows([(KILL, "kill")], path) == [["kill", "5,000", "5,000", "18–47", "0", "2"]]
    record([entry(KILL, 5000, 12)], {KILL}, "", path)
    assert fault_rows([(KILL, "kill")], path) == [["kill", "5,000", "5,000", "12–47", "0", "3"]]
    with pytest.raises(KeyError):
        fault_rows([(RESTART, "restart")], path)
