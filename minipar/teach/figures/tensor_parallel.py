"""Figures of the tensor-parallel chapter: what a TP rank holds, sends and saves.

Model state per rank as t grows (each weight matrix split t ways), the bytes one rank sends
per step with and without sequence parallelism against their formulas, and the activations
a rank keeps for the backward, and the ring steps of the collective matmul (`--tp-overlap`).
The notebook measures (CommLog, memory counts, step times); these draw.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...parallel.collective_matmul import gather_chunk, scatter_chunk
from ..style import COLORS, MEMORY_PARTS, formula_marks, log2_ticks, stacked_bars


def plot_tp_memory(measured: dict, formula: dict | None = None, unit: float = 1e6,
                   unit_name: str = "MB", ax=None):
    """What one TP rank holds, {tp: {params, grads, optimizer}} in bytes, as stacked bars;
    `formula` {tp: bytes} marks the expected total of each bar."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    tps = sorted(measured)
    stacked_bars(ax, {part: [measured[t][part] / unit for t in tps] for part in MEMORY_PARTS},
                 edgecolor="black", linewidth=0.5)
    if formula:
        formula_marks(ax, {x: formula[t] / unit for x, t in enumerate(tps)})
    ax.set_xticks(range(len(tps)))
    ax.set_xticklabels([f"tp={t}" for t in tps])
    ax.set_ylabel(f"per rank ({unit_name})")
    ax.set_title("model state per rank under tensor parallelism", fontsize=10)
    ax.legend(fontsize=8)
    return ax


# without SP: one all-reduce per row-parallel layer; with SP: an all-gather + reduce-scatter
TP_COMM_STYLES = {False: (COLORS["all_reduce"], "o", "-", "all-reduce (no SP)"),
                  True: (COLORS["reduce_scatter"], "s", "--", "all-gather + reduce-scatter (SP)")}


def plot_tp_comm(measured: dict, formula, tps=(1, 2, 4, 8), unit: float = 1e6,
                 unit_name: str = "MB", ax=None):
    """TP bytes one rank sends per step: `measured` {(tp, sp): bytes} as markers over the
    lines of `formula(tp, sp) -> bytes` for each tp in `tps`."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    for sp, (colour, marker, line, label) in TP_COMM_STYLES.items():
        ax.plot(tps, [formula(t, sp) / unit for t in tps], color=colour, linewidth=1.5,
                linestyle=line, label=f"formula, {label}")
        pts = sorted((t, b) for (t, s), b in measured.items() if s == sp)
        if pts:
            ax.plot([t for t, _ in pts], [b / unit for _, b in pts], linestyle="none",
                    marker=marker, markersize=6 if sp else 11, markerfacecolor="none", color=colour,
                    markeredgewidth=2, label=f"measured, {label}")
    log2_ticks(ax, tps, "tensor-parallel degree t")
    ax.set_ylabel(f"sent per rank per step ({unit_name})")
    ax.set_title("TP traffic: measured (CommLog) vs formula", fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_saved_activations(measured: dict, unit: float = 1e6, unit_name: str = "MB", ax=None):
    """Bytes one rank saves for the backward, {label: bytes}, as bars (e.g. per tp, SP or not)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    labels = list(measured)
    vals = [measured[k] / unit for k in labels]
    colours = [TP_COMM_STYLES["SP" in k][0] for k in labels]
    ax.bar(range(len(labels)), vals, color=colours, edgecolor="black", linewidth=0.5)
    for x, v in enumerate(vals):
        ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(f"saved for backward ({unit_name})")
    ax.set_ylim(0, max(vals) * 1.15)
    ax.set_title("activations one rank keeps for the backward", fontsize=10)
    return ax


def plot_collective_matmul(t: int = 4, axes=None):
    """The ring steps of `--tp-overlap`, one row per rank, one column per step. Left:
    all-gather-then-matmul (rank r multiplies chunk c of the sequence by its W_r while
    passing c on); right: matmul-then-reduce-scatter (rank r computes its part of output
    chunk c while the running sum of c arrives, adds, passes it on). The arrows are the
    t-1 messages of one chunk each that replace the collective."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 0.55 * t + 1.6))
    chunk_colours = plt.get_cmap("tab10").colors
    plans = ((axes[0], gather_chunk, "all-gather, then matmul:  x$_c$ W$_r$"),
             (axes[1], scatter_chunk, "matmul, then reduce-scatter:  part of y$_c$"))
    for ax, chunk, title in plans:
        for r in range(t):
            for k in range(t):
                c = chunk(r, t, k)
                ax.add_patch(plt.Rectangle((k + 0.05, r - 0.38), 0.6, 0.76, color=chunk_colours[c % 10],
                                           alpha=0.85))
                ax.text(k + 0.35, r, f"c={c}", ha="center", va="center", fontsize=8, color="white")
                if k < t - 1:     # the message in flight during this step: to rank r + 1
                    ax.annotate("", xy=(k + 0.95, (r + 1) % t), xytext=(k + 0.68, r),
                                arrowprops=dict(arrowstyle="->", color=COLORS["tp"], lw=1))
        ax.set_xlim(0, t)
        ax.set_ylim(t - 0.5, -0.5)
        ax.set_xticks([k + 0.35 for k in range(t)])
        ax.set_xticklabels([f"step {k}" for k in range(t)], fontsize=8)
        ax.set_yticks(range(t))
        ax.set_yticklabels([f"rank {r}" for r in range(t)], fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[0].figure.suptitle(f"collective matmul over t = {t} ranks: box = the matmul of a step "
                            f"(colour = sequence chunk), arrow = the chunk in flight meanwhile",
                            fontsize=9)
    return axes
