"""The collectives chapter's explorer (book/collectives.md): an all-reduce of S bytes over n
ranks, by algorithm (ring, tree, in-network, root), in bytes and in time.

Everything comes from `formulas.all_reduce_cost`, the alpha-beta model of the chapter:
`figure` draws it (the page shows its default: a 25 MB gradient bucket over 64 GPUs on
Llama 3's 50 GB/s network links), `explore` puts sliders on it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.formulas.collective_time import ALL_REDUCE_ALGORITHMS, all_reduce_cost
from ..figures.collectives import plot_algorithms
from ..style import PAGE_WIDTH
from ..widgets import choice, explorer, log_slider, powers

# a gradient bucket over Table 4 row 1's 64 replicas, on the cost model's network link
DEFAULTS = dict(n=64, size_mb=25.0, algorithm="ring", alpha_us=LLAMA3_CLUSTER.nic_latency_us,
                bandwidth_GBps=LLAMA3_CLUSTER.inter_node_GBps)


def figure(**values):
    """Bytes and time of each algorithm at (n, S), and time against S for all of them, the
    chosen `algorithm` drawn bold. Pure: the same picture for the same values."""
    kw = {**DEFAULTS, **values}
    n, size = kw["n"], kw["size_mb"] * 1e6
    alpha, bw = kw["alpha_us"] * 1e-6, kw["bandwidth_GBps"] * 1e9
    fig = plt.figure(figsize=(PAGE_WIDTH, 6.2))       # two bar charts, the curves below
    grid = fig.add_gridspec(2, 2)
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    plot_algorithms(n, size, alpha, bw, ax=axes[:2])
    sizes = [1e3 * 10 ** (k / 20) for k in range(141)]          # 1 kB to 10 GB
    for name in ALL_REDUCE_ALGORITHMS:
        chosen = name == kw["algorithm"]
        axes[2].plot(sizes, [all_reduce_cost(name, n, s, alpha, bw)[1] for s in sizes],
                     linewidth=2.5 if chosen else 1, alpha=1 if chosen else 0.5, label=name)
    axes[2].axvline(size, color="grey", linestyle=":")
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("message size S (bytes)", fontsize=8)
    axes[2].set_ylabel("time (s), modelled", fontsize=8)
    axes[2].legend(fontsize=8)
    sent, t = all_reduce_cost(kw["algorithm"], n, size, alpha, bw)
    fig.suptitle(f"{kw['algorithm']} all-reduce of {kw['size_mb']:g} MB over n = {n}: "
                 f"{sent / 1e6:.3g} MB sent by the busiest rank,\n{t * 1e3:.3g} ms "
                 f"(alpha {kw['alpha_us']:g} us, B {kw['bandwidth_GBps']:g} GB/s)", fontsize=9)
    fig.tight_layout()
    return fig


CONTROLS = {"n": powers(1, 14, "ranks n"), "size_mb": log_slider(-3, 4, "S (MB)"),
            "algorithm": choice(ALL_REDUCE_ALGORITHMS), "alpha_us": log_slider(-1, 3, "alpha (us)"),
            "bandwidth_GBps": log_slider(-1, 3, "B (GB/s)")}


# The settings the HTML book offers (teach/web.py draws each ahead of time): each algorithm
# bold; every n, and each slider's ends, its default and a value between, one at a time.
WEB = {"algorithm": list(ALL_REDUCE_ALGORITHMS)}
ALONE = {"n": list(CONTROLS["n"].values),
         "size_mb": sorted({0.001, 1.0, DEFAULTS["size_mb"], 1000.0, 1e4}),
         "alpha_us": sorted({0.1, 1.0, DEFAULTS["alpha_us"], 100.0, 1000.0}),
         "bandwidth_GBps": sorted({0.1, 1.0, 10.0, DEFAULTS["bandwidth_GBps"], 1000.0})}


def explore(**defaults):
    """Sliders for n, S, the algorithm, alpha and the link's bandwidth."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
