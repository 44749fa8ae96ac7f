"""``python -m bench [--quick]``: run every benchmark and write docs/benchmarks.md and docs/_static/lateness.png."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from typing import Any, Callable, Optional

from .common import ROOT, Config, log

__all__ = ["BENCHMARKS", "main"]

#: Benchmark name -> module, in run order.
BENCHMARKS = ("relay", "publish", "lateness", "footprint", "scale", "cancellations", "rounds", "bursts", "waiting",
              "index", "web")
#: The page a run writes, and where a full run keeps its results (for a later ``--merge``).
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
SAVED = os.path.join(ROOT, "docs", "_data", "bench-results.json")


def _replaced(previous: Any) -> str:
    """What a re-run of one benchmark replaces, for the page: the first run's error, or its figures."""
    if previous is None:
        return "not run before"
    if isinstance(previous, dict) and "error" in previous:
        return str(previous["error"])
    return "earlier figures"


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _guard(name: str, fn: Callable[[], Any]) -> Any:
    """Run one benchmark; a failure is recorded in the results, not hidden, and the run goes on."""
    started = time.monotonic()
    try:
        result = fn()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - reported in the page
        traceback.print_exc()
        log(f"{name} FAILED: {exc!r}")
        return {"error": f"{type(exc).__name__}: {exc}"}
    log(f"{name} done in {time.monotonic() - started:.0f}s")
    return result


def _lateness(config: Config) -> dict[str, Any]:
    from . import lateness_celery, lateness_kombu

    out: dict[str, Any] = {}
    kombu = _guard("lateness (a)/(b)", lambda: lateness_kombu.run(config))
    out.update(kombu if "error" not in kombu else {"a": {"name": "(a)/(b) kombu", **kombu}})
    celery = _guard("lateness (c)/(d)/(e)", lambda: lateness_celery.run(config))
    out.update(celery if "error" not in celery else {"c": {"name": "(c)-(e) Celery", **celery}})
    return out


def _run(name: str, config: Config) -> Any:
    if name == "lateness":
        return _lateness(config)
    module = __import__(f"bench.{name if name != 'relay' else 'throughput'}", fromlist=["run"])
    return _guard(name, lambda: module.run(config))


def write_outputs(results: dict[str, Any], meta: dict[str, Any], out: str, plot: Optional[str],
                  other: Optional[dict[str, Any]] = None) -> None:
    """Write the plot (when there are lateness figures) and the Markdown page."""
    from .plot import plot_lateness
    from .report import render

    rel_plot = None
    # the burst is one second wide: its figures are in the page, not on the mixed-delay plot
    lateness = {k: v for k, v in results.get("lateness", {}).items() if "lateness" in v and k != "burst"}
    if plot and lateness:
        title = f"Lateness under mixed delays ({meta['config']} run, {meta['finished']} UTC)"
        plot_lateness(lateness, plot, title=title)
        rel_plot = os.path.relpath(plot, os.path.dirname(os.path.abspath(out)))
    with open(out, "w") as fh:
        fh.write(render(results, meta, rel_plot, other))
    log(f"wrote {out}" + (f" and {plot}" if rel_plot else ""))


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmarks the arguments select and write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="reduced sizes: finishes in a few minutes")
    parser.add_argument("--only", default=",".join(BENCHMARKS),
                        help=f"comma-separated subset of {','.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--out", default=PAGE)
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "_static", "lateness.png"))
    parser.add_argument("--results", default=None, help="also keep the raw results as JSON here")
    parser.add_argument("--from-results", metavar="JSON", help="only re-render the report from saved results")
    parser.add_argument("--also", metavar="JSON", help="append another saved run's targets for comparison")
    parser.add_argument("--merge", metavar="JSON",
                        help="start from saved results and replace only the --only benchmarks (a re-run is noted); "
                             f"a full run saves its results in {os.path.relpath(SAVED, ROOT)}")
    args = parser.parse_args(argv)

    other = None
    if args.also:
        with open(args.also) as fh:
            other = json.load(fh)
    if args.from_results:
        with open(args.from_results) as fh:
            saved = json.load(fh)
        write_outputs(saved["results"], saved["meta"], args.out, args.plot, other)
        return 0

    selected = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = set(selected) - set(BENCHMARKS)
    if unknown:
        parser.error(f"--only: unknown benchmark(s) {sorted(unknown)}; choose from {', '.join(BENCHMARKS)}")
    config = Config.quick() if args.quick else Config.full()
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (nohup, &)
    from .report import environment

    meta: dict[str, Any] = {
        "config": config.name, "sizes": asdict(config), "environment": environment(),
        "command": "make bench-quick" if args.quick else "make bench",
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_start": _load(),
    }
    if selected != list(BENCHMARKS):
        meta["command"] = f"python -m bench{' --quick' if args.quick else ''} --only {','.join(selected)}"
    t0 = time.monotonic()
    results: dict[str, Any] = {}
    if args.merge:
        with open(args.merge) as fh:
            saved = json.load(fh)
        results, rerun = saved["results"], meta
        meta = saved["meta"]
        # the page says what each benchmark's latest run replaced: an earlier re-run of the same ones is dropped
        meta["reruns"] = [r for r in meta.get("reruns", []) if not set(r["benchmarks"]) <= set(selected)]
        meta["reruns"].append(
            {"benchmarks": selected, "started": rerun["started"], "load": rerun["load_start"],
             "replaced": {name: _replaced(results.get(name)) for name in selected}})
    # A full run's results are kept beside the page they render (a later --merge re-runs one benchmark on them);
    # a quick run's in the temporary directory.
    keep = args.results or (SAVED if config.name == "full" and args.out == PAGE
                            else os.path.join(tempfile.gettempdir(), f"ladder-bench-{config.name}.json"))
    try:
        for i, name in enumerate(selected, 1):
            log(f"=== benchmark {i}/{len(selected)}: {name} ({config.name}) ===")
            results[name] = _run(name, config)
            with open(keep, "w") as fh:  # what has finished survives an interrupted run
                json.dump({"results": results, "meta": meta}, fh)
    except KeyboardInterrupt:
        log(f"interrupted: vhosts and child processes are removed; finished benchmarks are in {keep}")
        return 130
    if not args.merge or "finished" not in meta:  # a merge into an interrupted run finishes it
        meta.update(finished=time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                    duration_s=meta.get("duration_s", 0.0) + time.monotonic() - t0, load_end=_load())
    with open(keep, "w") as fh:
        json.dump({"results": results, "meta": meta}, fh)
    log(f"raw results kept in {keep}")
    write_outputs(results, meta, args.out, args.plot, other)
    return 0


if __name__ == "__main__":
    sys.exit(main())
