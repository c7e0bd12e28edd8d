"""Figures of the tensor-parallel chapter: what a TP rank holds, sends and saves.

Model state per rank as t grows (each weight matrix split t ways), the bytes one rank sends
per step with and without sequence parallelism against their formulas, and the activations
a rank keeps for the backward, the ring steps of the collective matmul (`--tp-overlap`),
and the block itself: Megatron's f and g, or SP's all-gather and reduce-scatter, around
each rank's column- and row-parallel linears, read from `TP_PLAN`.
The notebook measures (CommLog, memory counts, step times); these draw.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from ...trainer.parallel.collective_matmul import gather_chunk, scatter_chunk
from ...trainer.parallel.tensor import TP_PLAN
from .. import replays
from .replayed import plot_replayed
from ..style import (COLORS, MEMORY_PARTS, PAGE_WIDTH, SMALL, formula_marks, lighter,
                     log2_ticks, stacked_bars)


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
        _, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 0.55 * t + 1.8))
    chunk_colours = plt.get_cmap("tab10").colors
    plans = ((axes[0], gather_chunk, "all-gather, then matmul:\nx$_c$ W$_r$"),
             (axes[1], scatter_chunk, "matmul, then reduce-scatter:\npart of y$_c$"))
    for ax, chunk, title in plans:
        for r in range(t):
            for k in range(t):
                c = chunk(r, t, k)
                ax.add_patch(plt.Rectangle((k + 0.05, r - 0.38), 0.6, 0.76, color=chunk_colours[c % 10],
                                           alpha=0.85))
                ax.text(k + 0.35, r, f"c={c}", ha="center", va="center", fontsize=SMALL,
                        color="white")
                if k < t - 1:     # the message in flight during this step: to rank r + 1
                    ax.annotate("", xy=(k + 0.95, (r + 1) % t), xytext=(k + 0.68, r),
                                arrowprops=dict(arrowstyle="->", color=COLORS["tp"], lw=1))
        ax.set_xlim(0, t)
        ax.set_ylim(t - 0.5, -0.5)
        ax.set_xticks([k + 0.35 for k in range(t)])
        ax.set_xticklabels([f"step {k}" for k in range(t)], fontsize=SMALL)
        ax.set_yticks(range(t))
        ax.set_yticklabels([f"rank {r}" for r in range(t)], fontsize=8)
        ax.set_title(title, fontsize=10)   # its subscripts at 7 pt: 9 px in a notebook
    axes[0].figure.suptitle(f"collective matmul over t = {t} ranks: box = the matmul of a step "
                            f"(colour = sequence chunk),\narrow = the chunk in flight meanwhile",
                            fontsize=9)
    axes[0].figure.tight_layout()
    return axes


# ------------------------------------------------------------------ the Megatron block
INNER_OP = {"self_attn": "attention\n(its heads)", "mlp": "silu(gate) * up\n(its units)"}
SEQ_REGION = {False: "[b, s, h] on every rank", True: "[b, s/t, h]: rank r's tokens"}


def block_plan(plan=None) -> list[tuple[str, list[str], list[str]]]:
    """(sub-block, its column-parallel linears, its row-parallel linears) of one layer, in
    order, read from `TP_PLAN` (the table `apply_tensor_parallel` applies)."""
    plan = TP_PLAN if plan is None else plan
    out = []
    for pattern, style in plan:
        parts = pattern.split(".")
        if style == "enter" and parts[0] == "layers":
            out.append((parts[-1], [], []))
        elif style in ("colwise", "rowwise") and out and parts[-2] == out[-1][0]:
            out[-1][1 if style == "colwise" else 2].append(parts[-1].removesuffix("_proj"))
    return out


def _box(ax, x, y, w, h, text, colour, fontsize=7, alpha=0.9):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02",
                                facecolor=colour, edgecolor="black", linewidth=0.6, alpha=alpha))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, x0, y0, x1, y1, colour="black"):
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color=colour, lw=0.8))


def _collective(sp: bool, enter: bool) -> tuple[str, str]:
    """(label, colour) of the collective that enters or leaves a TP region."""
    if sp:
        return (("all-gather\nalong s", COLORS["all_gather"]) if enter else
                ("reduce-\nscatter\nalong s", COLORS["reduce_scatter"]))
    return (("f\nfwd: identity\nbwd:\nall-reduce", "white") if enter else
            ("g\nfwd:\nall-reduce\nbwd: identity", COLORS["all_reduce"]))


def plot_megatron_block(t: int = 2, sp: bool = False, ax=None):
    """One transformer block under tensor parallelism over t ranks, as `TP_PLAN` splits it:
    per sub-block (one above the other), a norm on the replicated (or, with `sp`,
    sequence-sharded) activation, the collective that enters the region (f, or SP's
    all-gather), each rank's column-parallel linears, its share of attention or SwiGLU, its
    row-parallel linear, and the collective that leaves (g, or SP's reduce-scatter). In
    each sub-block, rows are ranks."""
    plan = block_plan()
    height = 0.8 * t + 1.1                      # one sub-block's band, its name included
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH, 0.55 * height * len(plan) + 0.5))
    for k, (name, cols, rows) in enumerate(plan):
        y0 = -k * height
        lanes = [y0 + t - 1 - r - (t - 1) / 2 for r in range(t)]
        ax.text(-0.5, y0 + 0.45 * t + 0.25, name, fontsize=8, weight="bold")
        _box(ax, 0, y0, 0.9, 0.8 * t, "RMSNorm\n" + ("1/t of the\ntokens" if sp else "replicated"),
             lighter(COLORS["tp"], 0.7), SMALL)
        label, colour = _collective(sp, True)
        _arrow(ax, 0.45, y0, 0.75, y0)
        _box(ax, 1.3, y0, 1.0, 0.8 * t, label, colour, SMALL)
        for r, y in enumerate(lanes):
            _arrow(ax, 1.8, y0, 2.1, y)
            _box(ax, 2.6, y, 0.95, 0.6, "col-parallel\n" + ", ".join(cols) + f" (r{r})",
                 lighter(COLORS["tp"], 0.4), SMALL)
            _box(ax, 3.75, y, 1.05, 0.6, INNER_OP.get(name, name), "white", SMALL)
            _box(ax, 4.9, y, 0.95, 0.6, "row-parallel\n" + ", ".join(rows) + f" (r{r})",
                 lighter(COLORS["tp"], 0.2), SMALL)
            _arrow(ax, 5.4, y, 5.75, y0)
        label, colour = _collective(sp, False)
        _box(ax, 6.3, y0, 1.0, 0.8 * t, label, colour, SMALL)
        _arrow(ax, 6.8, y0, 7.6, y0)
        ax.text(7.3, y0 + 0.1, "+ residual", fontsize=SMALL, ha="center", va="bottom")
    bottom = -(len(plan) - 1) * height - 0.45 * t
    ax.text(-0.5, bottom - 0.35, "between sub-blocks: " + SEQ_REGION[sp], fontsize=SMALL, ha="left")
    ax.set_xlim(-0.6, 7.8)
    ax.set_ylim(bottom - 0.5, 0.45 * t + 0.6)
    ax.axis("off")
    ax.set_title(f"one block under TP over t = {t} ranks" + (" with sequence parallelism" if sp else "")
                 + ":\n" + ", ".join(f"{n} ({'+'.join(c)} | {'+'.join(r)})" for n, c, r in plan),
                 fontsize=9)
    return ax


# ------------------------------------------------------------------ at H100 speed
def plot_replayed_tp():
    """Plain SP and the collective matmul (`--tp-overlap`), recorded on two gloo ranks and
    replayed at Llama 3 8B's shapes on H100s: rank 0's compute and TP communication. The
    plain layer waits for each all-gather and reduce-scatter; the ring hides behind the
    matmul of the chunk it already has."""
    return plot_replayed({"plain SP": replays.replayed("tensor_parallel"),
                          "collective matmul": replays.replayed("tensor_parallel_overlap")}, "tp")
