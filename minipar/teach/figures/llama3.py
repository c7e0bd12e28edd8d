"""Figures of the case-study chapter (book/llama3.md): Llama 3's layouts laid onto the
machine. Pure functions of the layout and the cluster; the rank order is the book's,
[TP, CP, PP, DP] innermost first (`grid.ProcessGrid`'s), so a model replica (one DP
coordinate) holds the consecutive ranks [r M, (r + 1) M) with M = TP x CP x PP.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.costmodel.table4 import TABLE4
from ..style import COLORS, PAGE_WIDTH


def replica_pods(tp: int, cp: int, pp: int, dp: int, pod_size: int) -> list[list[int]]:
    """For each model replica (DP rank r), the pods its GPUs sit in, in rank order."""
    size = tp * cp * pp
    return [list(range(r * size // pod_size, ((r + 1) * size - 1) // pod_size + 1)) for r in range(dp)]


def layout_figure(rows=(0, 2), pod_size: int | None = None):
    """Table 4's layouts on the machine: each model replica (TP x CP x PP consecutive GPUs)
    as a bar along the GPUs, pods as shaded bands; a replica that spans two pods is black."""
    pod_size = pod_size or LLAMA3_CLUSTER.pod_size
    fig, axes = plt.subplots(len(rows), 1, figsize=(PAGE_WIDTH, 1.3 * len(rows) + 0.6),
                             squeeze=False)
    for ax, i in zip(axes[:, 0], rows):
        row = TABLE4[i]
        draw_replicas(ax, row, pod_size)
        ax.set_title(f"Table 4 row {i + 1}: TP{row.tp} CP{row.cp} PP{row.pp} DP{row.dp}, "
                     f"{row.gpus:,} GPUs; a replica = {row.tp * row.cp * row.pp:,} GPUs",
                     fontsize=8)
    axes[-1, 0].set_xlabel("GPU rank (order [TP, CP, PP, DP]); grey bands: 3,072-GPU pods",
                           fontsize=8)
    fig.tight_layout()
    return fig


def draw_replicas(ax, row, pod_size: int):
    """One layout (a Table4Row) on `ax`: its model replicas along the GPUs, over the pods."""
    size = row.tp * row.cp * row.pp
    for p in range(-(-row.gpus // pod_size)):
        ax.add_patch(Rectangle((p * pod_size, 0), pod_size, 1, color="0.85" if p % 2 else "0.93", lw=0))
    for r, pods in enumerate(replica_pods(row.tp, row.cp, row.pp, row.dp, pod_size)):
        color = "black" if len(pods) > 1 else COLORS["dp"]
        gap = 0.97 if row.dp <= 16 else 1.0      # many replicas: no gaps (they would alias)
        ax.add_patch(Rectangle((r * size, 0.25), size * gap, 0.5, color=color, lw=0))
        if row.dp <= 16:
            ax.text(r * size + size / 2, 0.5, str(r), ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, row.gpus)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
