"""The lateness plot: one CDF per contender, with the early and the late-by-more-than-1-s regions shaded."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["plot_lateness"]

#: Colour per contender key, stable across runs.
COLOURS = {"a": "#d62728", "b": "#1f77b4", "b2": "#17becf", "c": "#7f7f7f", "d": "#2ca02c", "d2": "#bcbd22",
           "e": "#9467bd"}


def plot_lateness(contenders: dict[str, dict[str, Any]], path: str, *, title: str) -> str:
    """Draw the lateness CDFs of ``contenders`` (key -> {"name", "lateness" in ms}) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6.2), dpi=110)
    values = [v for c in contenders.values() for v in c["lateness"]]
    lo = min([-1000.0, *values]) * 1.3 if values else -1300.0
    hi = max([2000.0, *values]) * 1.3 if values else 2600.0
    ax.axvspan(lo, 0, color="#1f77b4", alpha=0.08, lw=0)
    ax.axvspan(1000, hi, color="#d62728", alpha=0.08, lw=0)
    ax.axvline(0, color="black", lw=0.8)
    ax.axvline(50, color="black", lw=0.6, ls=":")
    ax.text(lo * 0.9, 0.5, "early", va="center", ha="left", color="#1f77b4")
    ax.text(1100, 0.5, "late > 1 s", va="center", ha="left", color="#d62728")
    ax.text(55, 0.03, "+50 ms", va="bottom", ha="left", fontsize=8)
    for key, contender in sorted(contenders.items()):
        data = sorted(contender["lateness"])
        if not data:
            continue
        expected = contender["summary"]["expected"]
        ys = [(i + 1) / expected for i in range(len(data))]  # missing arrivals keep the CDF below 1
        label = f"{contender['name']} (n={len(data)}/{expected})"
        ax.step(data, ys, where="post", color=COLOURS.get(key), label=label, lw=1.6)
    ax.set_xscale("symlog", linthresh=10, linscale=0.8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("lateness: arrival or task start minus due time (ms, symlog)")
    ax.set_ylabel("fraction of messages")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
