"""The lateness plot: every contender's CDF, and below it the Celery contenders' milliseconds, spread out."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["plot_lateness", "celery_window_ms", "CELERY_KEYS"]

#: Colour per contender key, stable across runs.
COLOURS = {"a": "#d62728", "b": "#1f77b4", "b2": "#17becf", "c": "#7f7f7f", "d": "#2ca02c", "d2": "#bcbd22",
           "e": "#9467bd"}

#: Line style per contender key: the Celery curves lie close together, so they differ in style too.
STYLES = {"c": (0, (1, 1.5)), "d": "-", "d2": (0, (6, 2)), "e": (0, (6, 2, 1.5, 2))}

#: The Celery contenders, which the lower panel shows on a linear scale.
CELERY_KEYS = ("c", "d", "d2", "e")


def celery_window_ms(contenders: dict[str, dict[str, Any]]) -> float:
    """The lower panel's right edge: past the latest start of the ladder's and native delivery's tasks.

    Vanilla ETA's tail (seconds) would squash the rest, so it runs off the panel's edge.
    """
    latest = max((max(contenders[key]["lateness"]) for key in ("d", "d2", "e")
                  if contenders.get(key, {}).get("lateness")), default=0.0)
    return max(10.0, float(latest) * 1.2)


def _cdf(ax: Any, key: str, contender: dict[str, Any], *, lw: float) -> None:
    data = sorted(contender["lateness"])
    if not data:
        return
    expected = contender["summary"]["expected"]
    ys = [(i + 1) / expected for i in range(len(data))]  # missing arrivals keep the CDF below 1
    ax.step(data, ys, where="post", color=COLOURS.get(key), ls=STYLES.get(key, "-"), lw=lw,
            label=f"{contender['name']} (n={len(data)}/{expected})")


def plot_lateness(contenders: dict[str, dict[str, Any]], path: str, *, title: str) -> str:
    """Draw the lateness CDFs of ``contenders`` (key -> {"name", "lateness" in ms}) into ``path``.

    The upper panel has every contender on one symlog axis, where the Celery
    contenders overlap in a sliver; the lower one has them alone, from 0 to their
    slowest start, on an axis linear below 1 ms and logarithmic above it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    celery = {k: c for k, c in contenders.items() if k in CELERY_KEYS and c.get("lateness")}
    rows = 2 if celery else 1
    fig, axes = plt.subplots(rows, 1, figsize=(10, 7.4 + 4.2 * (rows - 1)), dpi=110, squeeze=False,
                             gridspec_kw={"height_ratios": [3.4, 2][:rows]})
    ax = axes[0][0]
    values = [v for c in contenders.values() for v in c["lateness"]]
    lo = min([-1000.0, *values]) * 1.3 if values else -1300.0
    hi = max([2000.0, *values]) * 1.3 if values else 2600.0
    ax.axvspan(lo, 0, color="#1f77b4", alpha=0.08, lw=0)
    ax.axvspan(1000, hi, color="#d62728", alpha=0.08, lw=0)
    ax.axvline(0, color="black", lw=0.8)
    ax.axvline(50, color="black", lw=0.6, ls=":")
    ax.text(lo * 0.9, 0.5, "early", va="center", ha="left", color="#1f77b4", fontsize=11)
    ax.text(1100, 0.5, "late > 1 s", va="center", ha="left", color="#d62728", fontsize=11)
    ax.text(55, 0.03, "+50 ms", va="bottom", ha="left", fontsize=9)
    for key, contender in sorted(contenders.items()):
        _cdf(ax, key, contender, lw=1.8)
    ax.set_xscale("symlog", linthresh=10, linscale=0.8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("lateness: arrival or task start minus due time (ms, symlog)", fontsize=10)
    ax.set_ylabel("fraction of messages", fontsize=10)
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=10, frameon=False)
    if celery:
        zoom = axes[1][0]
        edge = celery_window_ms(contenders)
        for key, contender in sorted(celery.items()):
            _cdf(zoom, key, contender, lw=2.2)
        zoom.set_xscale("symlog", linthresh=1, linscale=0.4)
        zoom.set_xlim(0, edge)
        zoom.set_ylim(0, 1.0)
        zoom.set_xlabel("task start minus ETA (ms, log above 1 ms): the Celery contenders up close; vanilla ETA's "
                        "tail of seconds runs off the right edge", fontsize=10)
        zoom.set_ylabel("fraction of tasks", fontsize=10)
        zoom.grid(True, which="both", alpha=0.25)
        zoom.legend(loc="lower right", fontsize=10, framealpha=0.9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
