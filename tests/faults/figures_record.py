"""The fault suite's figures, merged run after run into ``docs/_data/fault-figures.json``.

The guarantees page's "Measured" table is built from that file (``.. fault-figures::``,
docs/_ext/ladder_figures.py), so the table shows what the runs recorded and cannot drift
from it. Per test: the min–max of sent, delivered, duplicated and lost over the runs in
which the test passed, the number of those runs, and the RabbitMQ releases they ran on.
Stdlib only, no broker: the unit tests drive it with fake reports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Container, Iterable

#: The committed file the guarantees page's table is built from.
DATA = Path(__file__).resolve().parents[2] / "docs" / "_data" / "fault-figures.json"

#: The counts a scenario's row shows, each as ``[min, max]`` over the runs recorded.
COUNTS = ("sent", "delivered", "duplicated", "lost")

ABOUT = ("Written by the fault suite (tests/faults/figures_record.py): each run of make test-faults merges the "
         "figures of every test that passed into its entry: [min, max] of each count over the runs recorded, the "
         "number of those runs, and the RabbitMQ releases. docs/guarantees.rst's Measured table is built from it.")


def merge(data: dict[str, Any], entries: Iterable[dict[str, Any]], passed: Container[str],
          release: str = "") -> dict[str, Any]:
    """``data`` with the counts of each entry (``{"test": node id, "sent": ..., ...}``) merged in, for tests in
    ``passed`` only; entries without the four whole-number counts are no scenario of the table and are left out.
    Returns a new dict; raises on a malformed ``data`` (the caller keeps the file as it was)."""
    merged = json.loads(json.dumps(data))
    scenarios = merged.setdefault("scenarios", {})
    for entry in entries:
        counts: dict[str, Any] = {key: entry.get(key) for key in COUNTS}
        if entry.get("test") not in passed or not all(type(v) is int for v in counts.values()):
            continue
        old = scenarios.get(entry["test"])
        if old is None:
            scenarios[entry["test"]] = {**{k: [v, v] for k, v in counts.items()}, "runs": 1,
                                        "releases": [release] if release else []}
            continue
        for key, value in counts.items():
            low, high = old[key]
            old[key] = [min(int(low), value), max(int(high), value)]
        old["runs"] = int(old["runs"]) + 1
        if release and release not in old.setdefault("releases", []):
            old["releases"] = sorted([*old["releases"], release])
    return merged


def record(entries: list[dict[str, Any]], passed: Container[str], release: str = "", path: Path = DATA) -> str:
    """Merge a run's figures into ``path``; return a line saying what happened. Never raises: the figures are a
    by-product of the suite, which must neither fail nor skip for them (a malformed file is left as it was)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"about": ABOUT}
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        merged = merge(data, entries, passed, release)
        added = sum(s["runs"] for s in merged["scenarios"].values()) - \
            sum(s["runs"] for s in data.get("scenarios", {}).values())
        if not added:
            return f"no figures to merge into {path}"
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.name + ".tmp")
        scratch.write_text(json.dumps(merged, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        scratch.replace(path)
        return f"merged {added} test(s)' figures into {path}"
    except Exception as exc:  # noqa: BLE001 (the suite's own result matters, not this file)
        return f"figures not merged into {path}: {exc!r}"
