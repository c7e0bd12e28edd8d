"""Figures of the chapter "Real models in and out": the round trip of a Hugging Face
directory through minipar's ranks, and which slice of each tensor a rank reads.

Layers per stage come from `formulas.split_layers` (as the pipeline splits them), ranks
from `ProcessGrid`, and a tensor's split dimension from `TP_DIM`, the dimension
`parallel.tensor.shard_param` cuts it along (tests/test_exercises_hf.py checks it against a
parallelized model).
"""
from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, Rectangle

from ...config import ModelConfig
from ...costmodel.hardware import LLAMA3_CLUSTER
from ...formulas.pipeline_parallel import split_layers
from ...grid import ProcessGrid
from ..numbers.hf import kv_bytes_per_token

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
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.25, text, ha="center", fontsize=7)


def plot_round_trip(tp=2, pp=2, layers=4):
    """A Hugging Face directory in (each rank reads only its slices: its stage's layers, its
    TP rows or columns), training on the ranks, and out again (gathered to rank 0, written
    to a temporary name, renamed)."""
    grid = ProcessGrid(tp=tp, pp=pp)
    stages = split_layers(layers, pp)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.0 * pp))
    height = 1.0 * pp
    files = "config.json\nmodel-0000k-of-0000n\n.safetensors\nmodel.safetensors\n.index.json\ntokenizer.json"
    _box(ax, 0, 0, 2.2, height, "Hugging Face\ndirectory\n\n" + files, size=6.5)
    for r in range(grid.world_size):
        c = grid.coords(r)
        s = stages[c["pp"]]
        x, y = 3.6 + 1.7 * c["tp"], height - 1.0 * (c["pp"] + 1) + 0.1
        _box(ax, x, y, 1.5, 0.8, f"rank {r}\nlayers {s.start}-{s.stop - 1}\n"
             f"TP part {c['tp'] + 1} of {tp}", RANK_COLOURS[r % 8], size=6.5, ink="white")
    right = 3.6 + 1.7 * tp
    _arrow(ax, (2.3, height / 2), (3.5, height / 2), "read_piece\n(slices only)")
    _arrow(ax, (right, height / 2), (right + 1.4, height / 2), "shard_entries\n-> rank 0")
    _box(ax, right + 1.5, 0.15 * height, 1.8, 0.7 * height,
         "full tensors\non rank 0\n\nsave_pretrained:\nOUT.tmp, then\none rename", size=6.5)
    _arrow(ax, (right + 3.4, height / 2), (right + 4.2, height / 2))
    _box(ax, right + 4.3, 0, 1.8, height, "Hugging Face\ndirectory\n(transformers\nloads it)",
         size=7)
    ax.set_xlim(-0.1, right + 6.2)
    ax.set_ylim(-0.2, height + 0.5)
    ax.axis("off")
    ax.set_title(f"In, trained, out: {layers} layers on tp={tp} x pp={pp} ranks", fontsize=9)
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
        _, ax = plt.subplots(figsize=(11, 3.6))
    scale, x = 2.6 / max(max(s) for s in shapes.values()), 0.0
    for name, (rows, cols) in shapes.items():
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
        cut = {0: "rows", 1: "columns", None: "whole"}[dim_cut]
        ax.text(x + w / 2, 0.12, f"{name}\n[{rows}, {cols}]\n{cut}", ha="center", fontsize=6.5)
        x += w + 0.35
    stages = split_layers(layers, pp)
    ax.text(0, -2.95, "pipeline: " + ", ".join(f"stage {i} reads layers {s.start}-{s.stop - 1}"
                                              for i, s in enumerate(stages))
            + " (and the embedding on the first, the final norm and head on the last)", fontsize=7)
    ax.set_xlim(-0.1, x)
    ax.set_ylim(-3.1, 0.7)
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
