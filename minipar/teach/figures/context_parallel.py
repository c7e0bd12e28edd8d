"""Figures of the context-parallel chapter: splitting the sequence, and what it costs.

The causal attention matrix cut into 2*cp chunks, the work each rank does under the naive
(contiguous) and the load-balanced (zigzag) layouts, activation memory against sequence
length, ring vs all-gather bytes, and the mask one rank applies after an all-gather of K/V.
The layouts and the work counts come from `minipar.parallel.context` (pure functions).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Polygon, Rectangle

from ...formulas import cp_wire_bytes_per_step
from ...parallel.context import attention_work, contiguous_chunks, local_positions, zigzag_chunks
from ..style import COLORS, log2_ticks

CP_LAYOUTS = {"contiguous": contiguous_chunks, "zigzag": zigzag_chunks}


def _rank_colours(cp: int):
    cmap = plt.get_cmap("tab10" if cp <= 10 else "tab20")
    return [cmap(r % cmap.N) for r in range(cp)]


def plot_cp_layout(cp: int = 4, layout: str = "zigzag", ax=None):
    """The causal attention matrix at chunk resolution: query chunks down, key chunks across,
    each block coloured by the rank whose queries it serves. Full squares below the diagonal,
    triangles on it (causal inside the chunk), nothing above (masked: never computed)."""
    chunks = CP_LAYOUTS[layout]
    n = 2 * cp
    owner = {ch: r for r in range(cp) for ch in chunks(r, cp)}
    colours = _rank_colours(cp)
    if ax is None:
        _, ax = plt.subplots(figsize=(3.6, 3.6))
    for qc in range(n):
        for kc in range(qc + 1):
            c = colours[owner[qc]]
            if kc < qc:
                ax.add_patch(Rectangle((kc, qc), 1, 1, facecolor=c, edgecolor="white", linewidth=1))
            else:   # the diagonal block: the lower triangle (key <= query)
                ax.add_patch(Polygon([(kc, qc), (kc, qc + 1), (kc + 1, qc + 1)], closed=True,
                                     facecolor=c, edgecolor="white", linewidth=1))
        ax.text(n + 0.15, qc + 0.5, f"rank {owner[qc]}", va="center", fontsize=7,
                color=colours[owner[qc]])
    ax.set_xlim(0, n + 1.3)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    ax.set_xticks([i + 0.5 for i in range(n)])
    ax.set_xticklabels([str(i) for i in range(n)], fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(n)])
    ax.set_yticklabels([str(i) for i in range(n)], fontsize=7)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    work = attention_work(2 * cp * 64, cp, chunks)
    ax.set_title(f"{layout}, cp={cp}: busiest / idlest rank = {max(work) / min(work):.2f}",
                 fontsize=9)
    return ax


def plot_cp_work(cp: int = 4, seq_len: int | None = None, measured: dict | None = None, ax=None):
    """Attention work per rank (scores computed, from the ring schedule) for both layouts,
    as a fraction of a perfectly fair share. `measured`: {layout: [seconds per rank]},
    drawn as markers on the same scale (each normalised by its layout's mean)."""
    seq_len = seq_len or 2 * cp * 64
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    width = 0.38
    for i, (name, chunks) in enumerate(CP_LAYOUTS.items()):
        work = attention_work(seq_len, cp, chunks)
        fair = sum(work) / cp
        xs = [r + (i - 0.5) * width for r in range(cp)]
        ax.bar(xs, [w / fair for w in work], width, label=f"{name} (schedule)",
               color=COLORS[name], edgecolor="black", linewidth=0.5)
        if measured and name in measured:
            m = measured[name]
            mean = sum(m) / len(m)
            ax.plot(xs, [t / mean for t in m], linestyle="none", marker="D", color="black",
                    markersize=5, label="measured CPU time" if i == 0 else None)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xticks(range(cp))
    ax.set_xticklabels([f"rank {r}" for r in range(cp)])
    ax.set_ylabel("attention work / fair share")
    ax.set_title(f"causal attention work per rank, cp={cp}, {seq_len} tokens", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_cp_memory(seq_lens, measured: dict, unit: float = 1e6, unit_name: str = "MB", ax=None):
    """Bytes saved for the backward per rank against sequence length; `measured` is
    {cp: [bytes for each seq_len]} (cp = 1 is the single device)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, (cp, values) in enumerate(sorted(measured.items())):
        ax.plot(seq_lens, [v / unit for v in values], marker="os^D"[i % 4],
                label="one device" if cp == 1 else f"cp={cp}, per rank")
    log2_ticks(ax, seq_lens, "sequence length (tokens)")
    ax.set_yscale("log", base=2)
    ax.set_ylabel(f"saved for backward ({unit_name})")
    ax.set_title("activation memory per rank (measured)", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_cp_bytes(model, cps=(2, 4, 8, 16, 32), seq_lens=(8192, 32768, 131072), tp: int = 8,
                  dtype_bytes: int = 2, axes=None, impls=("ring", "allgather")):
    """Bytes one rank sends per layer (forward + backward, one sequence), by implementation
    (ring, all-gather, Ulysses where the heads allow the cp).
    Left: against cp at the longest sequence. Right: against sequence length at cp=16."""
    def per_layer(s, cp, impl):
        return cp_wire_bytes_per_step(model, 1, s, cp, impl, tp=tp, n_layers=1,
                                      dtype_bytes=dtype_bytes) / 1e6
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    s_max = max(seq_lens)
    markers = {"ring": "o", "allgather": "s", "ulysses": "^"}
    for impl in impls:
        # Ulysses shares the heads out: only cp dividing the TP rank's heads
        ok = [cp for cp in cps if impl != "ulysses" or (model.n_heads // tp) % cp == 0]
        axes[0].plot(ok, [per_layer(s_max, cp, impl) for cp in ok], color=COLORS[impl],
                     marker=markers[impl], label=impl)
        if impl != "ulysses" or (model.n_heads // tp) % 16 == 0:
            axes[1].plot(seq_lens, [per_layer(s, 16, impl) for s in seq_lens], color=COLORS[impl],
                         marker=markers[impl], label=impl)
    log2_ticks(axes[0], cps, "context-parallel degree cp")
    axes[0].set_title(f"{s_max:,} tokens", fontsize=10)
    axes[0].set_ylim(0, None)
    log2_ticks(axes[1], seq_lens, "sequence length", [f"{s // 1024}K" for s in seq_lens])
    axes[1].set_yscale("log")
    axes[1].set_title("cp = 16", fontsize=10)
    for ax in axes:
        ax.set_ylabel("MB sent per rank per layer")
        ax.legend(fontsize=8)
    axes[0].figure.suptitle(f"{model.name}: context-parallel traffic per rank (tp={tp}, "
                            f"{dtype_bytes}-byte values)", fontsize=10)
    return axes


def plot_allgather_mask(seq_len: int = 32, cp: int = 4, rank: int = 1, doc_lens=None, ax=None):
    """What one rank's queries may see after the all-gather: its s/cp queries (rows, in the
    order it holds them) against all gathered keys (columns, in rank order). With
    `doc_lens` (document lengths summing to seq_len) the document mask is added: one line."""
    q_pos = local_positions(seq_len, rank, cp)
    k_pos = torch.cat([local_positions(seq_len, r, cp) for r in range(cp)])
    mask = q_pos[:, None] >= k_pos[None, :]
    if doc_lens:
        doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
        mask &= doc[q_pos][:, None] == doc[k_pos][None, :]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.2))
    ax.imshow(mask.numpy(), cmap="Greens", vmin=0, vmax=1.4, aspect="auto", interpolation="nearest")
    n = seq_len // cp
    for r in range(1, cp):
        ax.axvline(r * n - 0.5, color="black", linewidth=0.8)
    ax.set_xticks([r * n + n / 2 - 0.5 for r in range(cp)])
    ax.set_xticklabels([f"keys of rank {r}" for r in range(cp)], fontsize=7)
    ax.set_yticks([0, n - 1])
    ax.set_yticklabels([f"pos {q_pos[0].item()}", f"pos {q_pos[-1].item()}"], fontsize=7)
    ax.set_title(f"rank {rank}'s mask after the all-gather"
                 + (f", documents {list(doc_lens)}" if doc_lens else ", causal"), fontsize=9)
    return ax
