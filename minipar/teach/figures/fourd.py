"""Figures of the 4D chapter: which ranks share a group along each axis.

One panel per axis over the same arrangement of ranks, a colour per group, read from the
grid's own `coords` and `all_groups`: nothing recomputed here.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ...grid import AXES, ProcessGrid
from ..style import AXIS_NAMES


def plot_rank_grid(tp: int = 2, cp: int = 2, pp: int = 2, dp: int = 2):
    """Which ranks share each group: one panel per axis, the same arrangement of ranks in
    each (a column per (cp, tp) pair, a row per (dp, pp) pair), ranks of one group in one
    colour. The arrangement is the grid's own `coords`, nothing recomputed here."""
    grid = ProcessGrid(tp, cp, pp, dp)
    fig, axes = plt.subplots(1, 4, figsize=(3.2 * 4, 3.4))
    for ax, axis in zip(axes, AXES):
        _draw_groups(ax, grid, axis)
    fig.suptitle(f"{grid.world_size} ranks, tp={tp} cp={cp} pp={pp} dp={dp}: "
                 "columns (cp, tp), rows (dp, pp); one colour per group", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def _draw_groups(ax, grid: ProcessGrid, axis: str):
    """One panel of `plot_rank_grid`: every rank a square, coloured by its `axis` group."""
    palette = plt.get_cmap("tab20").colors
    groups = grid.all_groups(axis)
    colour_of = {r: palette[i % len(palette)] for i, g in enumerate(groups) for r in g}
    tp, cp, pp, dp = (grid.sizes[a] for a in AXES)
    for r in range(grid.world_size):
        c = grid.coords(r)
        x, y = c["tp"] + tp * c["cp"], c["pp"] + pp * c["dp"]
        ax.add_patch(Rectangle((x + 0.05, -y - 0.95), 0.9, 0.9, color=colour_of[r], alpha=0.85))
        ax.text(x + 0.5, -y - 0.5, str(r), ha="center", va="center", fontsize=10, color="white",
                weight="bold")
    ax.set_xlim(0, tp * cp)
    ax.set_ylim(-pp * dp, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{AXIS_NAMES[axis]}: {len(groups)} groups of {len(groups[0])}", fontsize=10)
