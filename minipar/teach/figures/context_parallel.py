"""Figures of the context-parallel chapter: splitting the sequence, and what it costs.

The causal attention matrix cut into 2*cp chunks, the work each rank does under the naive
(contiguous) and the load-balanced (zigzag) layouts, activation memory against sequence
length, ring vs all-gather bytes, and the mask one rank applies after an all-gather of K/V.
The layouts and the work counts come from `minipar.trainer.parallel.context` (pure functions).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Polygon, Rectangle

from ...plan.config import ModelConfig
from ...plan.formulas.context_parallel import cp_wire_bytes_per_step
from ...plan.formulas.memory import activation_elements
from ...plan.schedules import stage_layer_counts
from ...trainer.parallel.context import (block_forward, local_positions, merge, ring_steps,
                                         zigzag_chunks)
from ...trainer.parallel.context_analysis import attention_work, contiguous_chunks
from .. import replays
from .replayed import plot_replayed
from ..style import COLORS, PAGE_WIDTH, log2_ticks

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
        _, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.4))
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
                            f"{dtype_bytes}-byte values)", fontsize=9)
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


# ------------------------------------------------------------------ on the chapter's page
def plot_layouts(cp: int = 4):
    """The naive and the zigzag layout side by side (the chapter's opening picture)."""
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.4))
    plot_cp_layout(cp, "contiguous", axes[0])
    plot_cp_layout(cp, "zigzag", axes[1])
    fig.tight_layout()
    return fig


def _pair_cell(ax, x0, y0, size, pairs, colour):
    """One rank's work at one ring step: its 2 query chunks (rows) x the block's 2 key
    chunks (columns); a full square, a causal triangle, or nothing (skipped by the mask)."""
    half = size / 2
    for a in range(2):
        for b in range(2):
            x, y = x0 + b * half, y0 + a * half
            ax.add_patch(Rectangle((x, y), half, half, facecolor="white", edgecolor="#DDDDDD",
                                   linewidth=0.5))
    for a, b, diagonal in pairs:
        x, y = x0 + b * half, y0 + a * half
        if diagonal:
            ax.add_patch(Polygon([(x, y), (x, y + half), (x + half, y + half)], closed=True,
                                 facecolor=colour, edgecolor="white"))
        else:
            ax.add_patch(Rectangle((x, y), half, half, facecolor=colour, edgecolor="white"))


def plot_ring_steps(cp: int = 4, layout: str = "zigzag"):
    """Ring attention, step by step (`ring_steps`): at step t rank r holds the K/V block of
    rank (r - t) mod cp (the label) and computes the chunk pairs the causal mask keeps:
    rows are its early and late query chunks, columns the block's early and late key
    chunks. Arrows: each block moves on to rank r + 1 for the next step."""
    chunks = CP_LAYOUTS[layout]
    colours = _rank_colours(cp)
    fig, ax = plt.subplots(figsize=(1.3 * cp + 1.6, 1.2 * cp + 0.8))
    for r in range(cp):
        for t, (src, pairs) in enumerate(ring_steps(r, cp, chunks)):
            x0, y0 = t * 1.3, r * 1.2
            _pair_cell(ax, x0, y0, 0.9, pairs, colours[src])
            ax.text(x0 + 0.45, y0 + 1.03, f"K/V of rank {src}", ha="center", fontsize=6,
                    color=colours[src])
            if t < cp - 1 and r < cp - 1:    # this block goes on to rank r + 1
                ax.annotate("", xy=(x0 + 1.3, y0 + 1.2 + 0.3), xytext=(x0 + 0.9, y0 + 0.6),
                            arrowprops=dict(arrowstyle="->", color="#BBBBBB", lw=0.6))
        ax.text(-0.15, r * 1.2 + 0.45, f"rank {r}\n{chunks(r, cp)}", ha="right", va="center",
                fontsize=7)
    for t in range(cp):
        ax.text(t * 1.3 + 0.45, -0.25, f"step {t}", ha="center", fontsize=8)
    ax.set_xlim(-1.1, cp * 1.3)
    ax.set_ylim(cp * 1.2, -0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    work = attention_work(2 * cp * 64, cp, chunks)
    work = attention_work(2 * cp * 64, cp, chunks)
    ax.set_title(f"ring attention, cp={cp}, {layout} chunks, work per rank / fair share: "
                 f"{', '.join(f'{w * cp / sum(work):.2f}' for w in work)}\nrows: the rank's "
                 f"query chunks (early, late); columns: the block's key chunks", fontsize=8)
    return fig


def plot_ulysses(cp: int = 4, heads: int = 8):
    """DeepSpeed-Ulysses' all-to-all: before it, each rank holds s/cp tokens of every head
    (columns: heads, rows: the sequence, coloured by owner); after it, the whole sequence
    of heads/cp heads. The second all-to-all after attention trades back."""
    colours = _rank_colours(cp)
    fig, axes = plt.subplots(1, 3, figsize=(PAGE_WIDTH, 2.9),
                             gridspec_kw={"width_ratios": [4, 1.3, 4]})
    per = heads // cp
    for ax, by_heads in ((axes[0], False), (axes[2], True)):
        for tok in range(cp):
            for h in range(heads):
                owner = h // per if by_heads else tok
                ax.add_patch(Rectangle((h, tok), 1, 1, facecolor=colours[owner],
                                       edgecolor="white", linewidth=1))
        ax.set_xlim(0, heads)
        ax.set_ylim(cp, 0)
        ax.set_xticks([h + 0.5 for h in range(heads)])
        ax.set_xticklabels([str(h) for h in range(heads)], fontsize=7)
        ax.set_yticks([t + 0.5 for t in range(cp)])
        ax.set_yticklabels([] if by_heads else [f"tokens of rank {t}" for t in range(cp)],
                           fontsize=7)
        ax.set_xlabel("attention head", fontsize=8)
        ax.set_title("after: all tokens,\nheads/cp heads each" if by_heads
                     else "before: s/cp tokens each,\nevery head", fontsize=8)
    axes[1].axis("off")
    axes[1].annotate("", xy=(0.95, 0.5), xytext=(0.05, 0.5), xycoords="axes fraction",
                     arrowprops=dict(arrowstyle="->", lw=2))
    axes[1].text(0.5, 0.62, "all-to-all\n(q, k, v)", ha="center", fontsize=8,
                 transform=axes[1].transAxes)
    axes[1].text(0.5, 0.25, "and back\nafter attention\n(the output)", ha="center", fontsize=7,
                 transform=axes[1].transAxes)
    fig.suptitle(f"Ulysses, cp={cp}, {heads} heads: colour = the rank that holds the piece",
                 fontsize=9)
    fig.tight_layout()
    return fig


def cp_bytes_figure(model: str = "llama3-405b", tp: int = 8):
    """`plot_cp_bytes` for a preset, all three implementations."""
    axes = plot_cp_bytes(ModelConfig.preset(model), tp=tp, impls=("ring", "allgather", "ulysses"))
    axes[0].figure.tight_layout()
    return axes[0].figure


def plot_long_context_memory(cps=(1, 4, 16), seq_lens=(8192, 16384, 32768, 65536, 131072)):
    """Llama 3 405B, TP8 + SP, bf16: activations of one micro-batch through the fullest
    pipeline stage of PP16 (formulas.activation_elements: Korthikanti's count for fused
    kernels), per GPU, against the sequence length for each CP degree."""
    m = ModelConfig.preset("llama3-405b")
    per_token = activation_elements(m, 8, True, "none") * 2 * max(stage_layer_counts(m.n_layers, 16))
    fig, ax = plt.subplots(figsize=(5.8, 3.4))
    for i, cp in enumerate(cps):
        ax.plot(seq_lens, [per_token * s / cp / 1e9 for s in seq_lens], marker="os^D"[i % 4],
                label=f"cp={cp}")
    ax.axhline(80 * 2**30 / 1e9, color="black", linestyle="--", linewidth=1)
    ax.text(seq_lens[0], 80 * 2**30 / 1e9 * 1.1, "H100: 80 GiB", fontsize=8)
    log2_ticks(ax, seq_lens, "sequence length", [f"{s // 1024}K" for s in seq_lens])
    ax.set_yscale("log", base=2)
    ax.set_ylabel("GB per GPU, one micro-batch")
    ax.set_title("Llama 3 405B, TP8+SP, one PP16 stage: activations (modelled)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_lse_merge(n_keys: int = 12, split: int = 5, seed: int = 0):
    """One query against n_keys keys, in two blocks (the first `split` keys, the rest):
    each block's own softmax (left), the merged weights exp(l_j - l) times each block's
    softmax (right), and the softmax over all keys (dots), from block_forward and merge."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 1, 4, generator=gen), torch.randn(1, n_keys, 1, 4, generator=gen)
    eye = torch.eye(n_keys).reshape(1, n_keys, 1, n_keys)     # v = one-hot: out = the weights
    blocks = [(0, split), (split, n_keys)]
    parts = [block_forward(q, k[:, a:b], eye[:, a:b], False, 0.5) for a, b in blocks]
    merged, _ = merge(*parts[0], *parts[1])
    whole, _ = block_forward(q, k, eye, False, 0.5)
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 2.6), sharey=True)
    for (o, _), (a, b), colour in zip(parts, blocks, (COLORS["ring"], COLORS["allgather"])):
        axes[0].bar(range(a, b), o.flatten()[a:b].tolist(), color=colour)
        axes[1].bar(range(a, b), merged.flatten()[a:b].tolist(), color=colour)
    axes[1].plot(range(n_keys), whole.flatten().tolist(), "k.", label="softmax over all keys")
    axes[0].set_title("each block normalised on its own", fontsize=9)
    axes[1].set_title("merged: reweighted by exp(l_j - l)", fontsize=9)
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("key")
    axes[0].set_ylabel("attention weight")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ at H100 speed
def plot_replayed_cp():
    """Ring and all-gather attention, recorded on two gloo ranks and replayed at Llama 3 8B's
    shapes and 32K tokens on H100s: rank 0's compute and CP communication. The ring passes
    each K/V block while the previous one's attention runs; the all-gather waits for all."""
    return plot_replayed({"ring": replays.replayed("context_parallel"),
                          "all-gather": replays.replayed("context_parallel_allgather")}, "cp")
