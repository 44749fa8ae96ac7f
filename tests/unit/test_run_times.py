"""The README's ``make test`` times are runs that ``docs/_data/run-times.json`` records (tests/run_times.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import run_times
from docs_blocks import ROOT

#: The README's sentence: the parallel runs' minutes at their load averages, and the one-at-a-time run's.
SENTENCE = re.compile(r"(\d+) minutes at a load average of (\d+) to (\d+), (\d+) at (\d+) to (\d+) \(run one\s+"
                      r"test at a time, it took (\d+)\)")


def test_the_readme_quotes_recorded_runs_of_make_test() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    found = SENTENCE.search(readme)
    assert found, "the README's make test times are not in the form tests/unit/test_run_times.py reads: update both"
    a, a_low, a_high, b, b_low, b_high, serial = (int(n) for n in found.groups())
    runs = json.loads(run_times.DATA.read_text())["runs"]["make-test"]

    def recorded(minutes: int, load: Any, parallel: bool) -> bool:
        return any(round(r["minutes"]) == minutes and (r["workers"] != 0) == parallel
                   and (load is None or [round(x) for x in r["load"] or ()] == load) for r in runs)

    for minutes, load in ((a, [a_low, a_high]), (b, [b_low, b_high])):
        assert recorded(minutes, load, True), f"the README's {minutes} min at load {load}: no such run in " \
                                              f"{run_times.DATA}"
    assert recorded(serial, None, False), f"the README's {serial} min one at a time: no such run"


def test_a_run_is_appended_and_a_bad_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "run-times.json"
    run = {"minutes": 14.2, "load": [2.5, 7.9], "workers": 3, "passed": True}
    assert run_times.record("make-test", run, path).startswith("make-test: 14.2 min at load [2.5, 7.9] recorded")
    run_times.record("make-test", {**run, "minutes": 16.0}, path)
    assert [r["minutes"] for r in json.loads(path.read_text())["runs"]["make-test"]] == [14.2, 16.0]
    for bad in ("{", "[]", json.dumps({"runs": {"make-test": {}}})):
        path.write_text(bad)
        assert "not recorded" in run_times.record("make-test", run, path)
        assert path.read_text() == bad
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert "not recorded" in run_times.record("make-test", run, blocked / "run-times.json")


def test_the_file_keeps_the_latest_runs_and_the_seeded_ones() -> None:
    data: dict[str, Any] = {"runs": {"t": [{"minutes": 29, "seed": "by hand"}]}}
    for n in range(run_times.KEEP + 5):
        data = run_times.add_run(data, "t", {"minutes": n})
    kept = data["runs"]["t"]
    assert len(kept) == run_times.KEEP and kept[0] == {"minutes": 29, "seed": "by hand"}
    assert kept[-1] == {"minutes": run_times.KEEP + 4}


@pytest.mark.parametrize("makeflags, recorded", [("", True), (" --no-print-directory", True), ("n", False),
                                                 ("kn --no-print-directory", False)])
def test_main_records_the_run_and_returns_the_suites_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, makeflags: str, recorded: bool) -> None:
    monkeypatch.setattr(run_times, "DATA", tmp_path / "run-times.json")
    monkeypatch.setattr(run_times, "timed", lambda command: (2, 15.04, [3.14, 7.96, 5.0]))
    monkeypatch.setenv("MAKEFLAGS", makeflags)
    assert run_times.main(["make-test", "3", "--", "make", "test-passes"]) == 2
    if recorded:
        (run,) = json.loads((tmp_path / "run-times.json").read_text())["runs"]["make-test"]
        assert {k: run[k] for k in ("minutes", "load", "workers", "passed")} == \
            {"minutes": 15.0, "load": [3.1, 8.0], "workers": 3, "passed": False}
    else:
        assert not (tmp_path / "run-times.json").exists()
