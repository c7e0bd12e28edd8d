"""The cluster chapter's explorer: a [TP, CP, PP, DP] layout -> where its ranks land on
servers and pods, and which link each axis' rings cross (`minipar.runtime.topology`)."""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.costmodel.hardware import Cluster
from ...trainer.grid import AXES, ProcessGrid
from ...runtime import topology as place
from ..figures.cluster import plot_grid_on_cluster
from ..style import PAGE_WIDTH
from ..widgets import choice, explorer

DEFAULTS = dict(tp=2, cp=1, pp=4, dp=8, gpus_per_node=8, pod_size=32)
DRAWN = 128     # above this many ranks only the link counts are drawn, not every rank


def figure(tp=2, cp=1, pp=4, dp=8, gpus_per_node=8, pod_size=32):
    """Top: the ring hops of each axis by the link they cross (NVLink, one rail, the spine,
    between pods). Below, for up to 128 ranks: every rank on its server, the groups of
    rank 0 coloured."""
    grid = ProcessGrid(tp, cp, pp, dp)
    cluster = Cluster(gpus_per_node=gpus_per_node, gpus_per_rack=2 * gpus_per_node,
                      pod_size=pod_size)
    small = grid.world_size <= DRAWN
    # 6.4 inches tall: with its controls, the explorer fits a laptop's 800 px screen
    fig = plt.figure(figsize=(PAGE_WIDTH, 6.4 if small else 3.4))
    rows = fig.add_gridspec(2 if small else 1, 1, height_ratios=[1, 2.2] if small else None)
    ax = fig.add_subplot(rows[0])
    axes = [a for a in AXES if grid.sizes[a] > 1]
    hops = {a: place.ring_links(grid, a, cluster) for a in axes}
    bottom = [0.0] * len(axes)
    for k, linkname in enumerate(place.LINKS):
        share = [hops[a][linkname] / max(1, sum(hops[a].values())) for a in axes]
        ax.bar([a.upper() for a in axes], share, bottom=bottom, label=linkname,
               color=["#4C72B0", "#55A868", "#DD8452", "#C44E52"][k])
        bottom = [b + s for b, s in zip(bottom, share)]
    ax.set(ylim=(0, 1), ylabel="share of the axis' ring hops",
           title=f"{grid.world_size:,} ranks: tp={tp} cp={cp} pp={pp} dp={dp}\n"
                 f"servers of {gpus_per_node}, pods of {pod_size:,}, rail-optimized")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left")
    if small:
        plot_grid_on_cluster(tp, cp, pp, dp, gpus_per_node, 2 * gpus_per_node, pod_size,
                             ax=fig.add_subplot(rows[1]))
    fig.tight_layout()
    return fig


CONTROLS = {"tp": choice([1, 2, 4, 8]), "cp": choice([1, 2, 4, 8, 16]), "pp": choice([1, 2, 4, 8, 16]),
            "dp": choice([1, 2, 4, 8, 16, 64, 128]), "gpus_per_node": choice([4, 8]),
            "pod_size": choice([16, 32, 64, 3072])}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every TP degree,
# each with every value of the other controls one at a time (both server sizes: does TP stay
# on NVLink?).
WEB = {"tp": list(CONTROLS["tp"].values)}
ALONE = {name: list(CONTROLS[name].values)
         for name in ("cp", "pp", "dp", "gpus_per_node", "pod_size")}


def explore(**defaults):
    """Dropdowns over `figure`."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
