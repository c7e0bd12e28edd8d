"""Figures of a replayed run (`minipar.replay`), shared by the axis chapters: "The same run at
H100 speed" draws one rank of two runs (bucketed and naive DP, plain SP and the collective
matmul, ring and all-gather CP) on one clock, its compute and one axis's communication,
split by `traces.hidden_and_exposed` into hidden (the rank computed meanwhile, green) and
exposed (it waited, red), as the cluster chapter draws a measured trace.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ...plan import traces
from ..style import COLORS, GREEN, GREY, PAGE_WIDTH, RED


def _ms(seconds: float) -> str:
    """Two significant digits, in ms (a replay's split of a layer over its collectives
    follows the CPU's timing, so the third digit varies run to run); below 10 µs, 0."""
    return f"{seconds * 1e3:.2g}" if seconds >= 1e-5 else "0"


def plot_rank(ax, trace: dict, axis: str, pid: int = 0):
    """Rank `pid` of a replayed trace on two rows, in ms: its compute spans (F, B, the
    optimizer), and its communication on `axis`, hidden or exposed."""
    for e in traces.spans(trace, "compute", pid):
        kind = e["args"].get("kind")
        ax.barh(0, e["dur"] / 1e3, left=e["ts"] / 1e3, height=0.8, linewidth=0.3,
                color=COLORS[kind] if kind in ("F", "B", "W") else GREY, edgecolor="white")
    hidden, exposed = traces.hidden_and_exposed(trace, pid).get(axis, ([], []))
    for intervals, colour in ((hidden, GREEN), (exposed, RED)):
        for a, b in intervals:
            ax.barh(1, (b - a) / 1e3, left=a / 1e3, height=0.6, color=colour)
    ax.set_yticks([0, 1])
    ax.set_yticklabels([f"rank {pid} compute", axis], fontsize=7)
    ax.set_ylim(1.5, -0.5)


def plot_replayed(runs: dict, axis: str, pid: int = 0):
    """The same rank of several replayed runs ({label: Replay}), a panel each on one clock,
    so a longer step is a longer row. Titles: the step, and `axis`'s exposed and hidden time
    (mean over ranks, as `Replay` reports them)."""
    fig, axs = plt.subplots(len(runs), 1, sharex=True, squeeze=False,
                            figsize=(PAGE_WIDTH - 0.9, 1.25 * len(runs) + 0.6))
    for ax, (label, run) in zip(axs[:, 0], runs.items()):
        plot_rank(ax, run.trace, axis, pid)
        ax.set_title(f"{label}: step {run.step_time_s * 1e3:,.0f} ms, {axis.upper()} "
                     f"{_ms(run.exposed_s[axis])} ms exposed, {_ms(run.hidden_s[axis])} ms hidden",
                     fontsize=8)
    axs[-1, 0].set_xlim(0, max(r.step_time_s for r in runs.values()) * 1e3)
    axs[-1, 0].set_xlabel("time since the step began (ms, on H100s)")
    axs[0, 0].legend(handles=[Patch(color=COLORS["F"], label="F"), Patch(color=COLORS["B"], label="B"),
                              Patch(color=GREY, label="optimizer"),
                              Patch(color=GREEN, label="comm, hidden"),
                              Patch(color=RED, label="comm, exposed")],
                     fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig
