"""Figures of the chapter "Real models in and out": the round trip of a Hugging Face
directory through minipar's ranks, and which slice of each tensor a rank reads.

Layers per stage come from `parallel.schedules.split_layers` (as the pipeline splits them), ranks
from `ProcessGrid`, and a tensor's split dimension from `TP_DIM`, the dimension
`parallel.tensor.shard_param` cuts it along (tests/test_exercises_hf.py checks it against a
parallelized model).
"""
from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, Rectangle

from ...plan.config import ModelConfig
from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.schedules import split_layers
from ...trainer.grid import ProcessGrid
from ..numbers.hf import kv_bytes_per_token
from ..style import PAGE_WIDTH, SMALL

# the dimension each weight is cut along under tensor parallelism (None: replicated)
TP_DIM = {"embed_tokens": 0, "q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1,
          "gate_proj": 0, "up_proj": 0, "down_proj": 1, "input_layernorm": None,
          "post_attention_layernorm": None, "norm": None, "lm_head": 0}
RANK_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860",
                "#DA8BC3", "#8C8C8C"]


def _box(ax, x, y, w, h, text, colour="#EEEEEE", size=7, ink="black"):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="grey"))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=ink)


def _arrow(ax, a, b, text=""):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color="black"))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.25, text, ha="center", fontsize=SMALL)


def plot_round_trip(tp=2, pp=2, layers=4):
    """A Hugging Face directory in (each rank reads only its slices: its stage's layers, its
    TP rows or columns), training on the ranks, and out again (gathered to rank 0, written
    to a temporary name, renamed)."""
    grid = ProcessGrid(tp=tp, pp=pp)
    stages = split_layers(layers, pp)
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 1.4 + 1.1 * pp))
    height, rank_w, gap = 1.0 * pp, 1.9, 2.1
    files = "config.json\n*.safetensors\n(+ index.json)\ntokenizer.json"
    _box(ax, 0, 0, 2.4, height, "Hugging Face\ndirectory\n\n" + files, size=SMALL)
    left = 2.4 + gap
    for r in range(grid.world_size):
        c = grid.coords(r)
        s = stages[c["pp"]]
        x, y = left + (rank_w + 0.2) * c["tp"], height - 1.0 * (c["pp"] + 1) + 0.1
        _box(ax, x, y, rank_w, 0.8, f"rank {r}\nlayers {s.start}-{s.stop - 1}\n"
             f"TP part {c['tp'] + 1}/{tp}", RANK_COLOURS[r % 8], size=SMALL, ink="white")
    right = left + (rank_w + 0.2) * tp - 0.2
    _arrow(ax, (2.5, height / 2), (left - 0.1, height / 2), "read_piece\n(slices)")
    _arrow(ax, (right + 0.1, height / 2), (right + gap - 0.1, height / 2),
           "shard_entries\n-> rank 0")
    _box(ax, right + gap, 0.1 * height, 2.7, 0.8 * height,
         "full tensors\non rank 0\n\nsave_pretrained:\nOUT.tmp, then\none rename", size=SMALL)
    out = right + gap + 2.7 + 1.0
    _arrow(ax, (out - 0.9, height / 2), (out - 0.1, height / 2))
    _box(ax, out, 0, 2.3, height, "Hugging Face\ndirectory\n(transformers\nloads it)",
         size=SMALL)
    ax.set_xlim(-0.1, out + 2.4)
    ax.set_ylim(-0.2, height + 0.3)
    ax.axis("off")
    ax.set_title(f"In, trained, out: {layers} layers on tp={tp} x pp={pp} ranks", fontsize=9)
    fig.subplots_adjust(left=0, right=1, bottom=0, top=0.9)    # the boxes use the width
    return fig


def plot_slices(tp=2, pp=2, layers=4, dim=128, heads=4, kv_heads=2, ffn=384, vocab=512, ax=None):
    """Which part of each weight of one layer (and of the embedding) each TP rank reads:
    every matrix drawn to scale, its slices coloured by TP rank; replicated ones grey."""
    hd = dim // heads
    shapes = {"embed_tokens": (vocab, dim), "q_proj": (heads * hd, dim),
              "k_proj": (kv_heads * hd, dim), "v_proj": (kv_heads * hd, dim),
              "o_proj": (dim, heads * hd), "gate_proj": (ffn, dim), "up_proj": (ffn, dim),
              "down_proj": (dim, ffn), "input_layernorm": (1, dim)}
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.2))
    scale, x = 2.6 / max(max(s) for s in shapes.values()), 0.0
    names = list(shapes)
    labels = {n: f"{n}\n[{r}, {c}]\n" + {0: "rows", 1: "columns", None: "whole"}[TP_DIM[n]]
              for n, (r, c) in shapes.items()}
    half_label = lambda n: 0.085 * max(map(len, labels[n].split("\n")))   # noqa: E731
    for i, (name, (rows, cols)) in enumerate(shapes.items()):
        w, h = cols * scale, rows * scale
        dim_cut = TP_DIM[name]
        for t in range(tp if dim_cut is not None else 1):
            colour = RANK_COLOURS[t] if dim_cut is not None else "#BBBBBB"
            if dim_cut == 0:
                ax.add_patch(Rectangle((x, -(t + 1) * h / tp), w, h / tp, facecolor=colour, edgecolor="white"))
            elif dim_cut == 1:
                ax.add_patch(Rectangle((x + t * w / tp, -h), w / tp, h, facecolor=colour, edgecolor="white"))
            else:
                ax.add_patch(Rectangle((x, -h), w, max(h, 0.04), facecolor=colour))
        ax.text(x + w / 2, 0.12, labels[name], ha="center", fontsize=SMALL)
        if i + 1 < len(names):                # the next matrix, clear of this one and its label
            nxt = names[i + 1]
            x = max(x + w + 0.35, x + w / 2 + half_label(name) + 0.2 + half_label(nxt)
                    - shapes[nxt][1] * scale / 2)
    stages = split_layers(layers, pp)
    ax.text(0, -2.95, "pipeline: " + ", ".join(f"stage {i} reads layers {s.start}-{s.stop - 1}"
                                              for i, s in enumerate(stages))
            + " (and the embedding on the first, the final norm and head on the last)", fontsize=7)
    ax.set_xlim(-0.1, x + w)
    ax.set_ylim(-3.1, 1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"What TP rank k of {tp} reads of one layer (colour k), to scale", fontsize=9)
    return ax.figure


def plot_kv_cache(model="llama3-405b", max_len=131072):
    """The KV cache of one sequence against its length (bf16), with the model's grouped KV
    heads and, for comparison, with one KV head per query head; dotted: one GPU's HBM."""
    m = ModelConfig.preset(model)
    lengths = np.linspace(0, max_len, 200)
    mha = dataclasses.replace(m, n_kv_heads=m.n_heads)
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for cfg, label in ((m, f"{m.n_kv_heads} KV heads (GQA)"), (mha, f"{m.n_heads} KV heads (MHA)")):
        ax.plot(lengths / 1024, lengths * kv_bytes_per_token(cfg) / 1e9, label=label)
    ax.axhline(LLAMA3_CLUSTER.hbm_gb, color="grey", linestyle=":", label="one H100's HBM")
    ax.set(xlabel="tokens in the sequence (K)", ylabel="KV cache (GB, bf16)", yscale="log",
           title=f"{model}: the KV cache of one sequence")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    return fig
