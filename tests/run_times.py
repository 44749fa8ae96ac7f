"""Time a suite's run and record it in ``docs/_data/run-times.json``, which the README's figures quote.

``python tests/run_times.py NAME WORKERS -- COMMAND...`` runs COMMAND, samples the 1-minute
load average every 15 s while it runs, and appends ``{"minutes", "load": [min, max],
"workers", "passed"}`` to NAME's runs (``make test`` runs through it). It exits with
COMMAND's status; recording never changes it (a malformed or unwritable file is reported on
stderr and left as it was). ``tests/unit/test_run_times.py`` fails when the README quotes a
run the file does not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: The committed file the README's suite times come from.
DATA = Path(__file__).resolve().parents[1] / "docs" / "_data" / "run-times.json"

#: How many runs per name the file keeps (the oldest go first; a seeded run the README quotes is kept).
KEEP = 20


def add_run(data: dict[str, Any], name: str, run: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``run`` appended to ``name``'s runs, the oldest unquoted ones dropped past :data:`KEEP`."""
    merged = json.loads(json.dumps(data))
    runs = merged.setdefault("runs", {}).setdefault(name, [])
    if not isinstance(runs, list):
        raise ValueError(f"runs of {name!r} are not a list")
    runs.append(run)
    while len(runs) > KEEP and any(not r.get("seed") for r in runs[:-1]):
        runs.remove(next(r for r in runs if not r.get("seed")))
    return merged


def record(name: str, run: dict[str, Any], path: Path | None = None) -> str:
    """Append ``run`` to ``path`` (:data:`DATA`); return a line saying what happened. Never raises."""
    path = path or DATA
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        merged = add_run(data, name, run)
        scratch = path.with_name(path.name + ".tmp")
        scratch.write_text(json.dumps(merged, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        scratch.replace(path)
        return f"{name}: {run['minutes']} min at load {run['load']} recorded in {path}"
    except Exception as exc:  # noqa: BLE001 (the suite's status matters, not this file)
        return f"{name}: run time not recorded in {path}: {exc!r}"


def timed(command: list[str], every: float = 15.0) -> tuple[int, float, list[float]]:
    """Run ``command``; return its status, its minutes and the 1-minute load averages sampled meanwhile."""
    loads = [os.getloadavg()[0]]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    try:
        status = subprocess.call(command)
    finally:
        done.set()
    loads.append(os.getloadavg()[0])
    return status, (time.monotonic() - started) / 60, loads


def dry_run(makeflags: str) -> bool:
    """Whether make runs with ``-n`` (it still runs a recipe that calls ``$(MAKE)``): then nothing is recorded."""
    first = makeflags.split()[0] if makeflags.split() else ""
    return not first.startswith("-") and "n" in first


def main(argv: list[str]) -> int:
    name, workers, dash, *command = argv
    if dash != "--" or not command:
        raise SystemExit("usage: run_times.py NAME WORKERS -- COMMAND...")
    status, minutes, loads = timed(command)
    if dry_run(os.environ.get("MAKEFLAGS", "")):
        return status
    run = {"minutes": round(minutes, 1), "load": [round(min(loads), 1), round(max(loads), 1)],
           "workers": int(workers) if workers.isdigit() else workers, "passed": status == 0,
           "at": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    print(record(name, run), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
