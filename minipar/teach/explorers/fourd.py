"""The 4D chapter's explorer (book/fourd.md): the planner's ranking as the model, the GPU,
the cluster size, the sequence and the batch change.

Every fitting layout is `costmodel.planner.plan`'s (the function `make test` runs on three
cases), drawn by `figures.fourd.plot_plan`: each of the best layouts as the shares of its
step (compute, TP, CP, bubble, PP, DP, optimizer) with its MFU and what limits it
(`planner.limiting_term`'s largest loss, as the CLI's plan prints it). When nothing fits, the
figure names the constraint that binds (`planner.binding_constraint`).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import ConfigError, ModelConfig
from ...plan.costmodel import GPU_NAMES, binding_constraint, gpu_cluster, plan
from ...plan.costmodel.planner import describe, limiting_term
from ..figures.fourd import plot_plan
from ..style import INVALID
from ..widgets import choice, explorer, powers, steps, toggle

MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
DEFAULTS = dict(model="llama3-70b", gpu="h100", gpus=1024, seq_len=8192, batch_mtokens=4,
                tp_overlap=False, top=6)


def figure(**values):
    """The planner's `top` layouts for the chosen model, GPU, cluster size, sequence length
    and global batch (millions of tokens, 2**20), best first."""
    kw = {**DEFAULTS, **values}
    cluster = gpu_cluster(kw["gpu"])
    try:
        p = plan(ModelConfig.preset(kw["model"]), cluster, kw["gpus"], kw["seq_len"],
                 int(kw["batch_mtokens"] * 2**20), top=kw["top"], tp_overlap=kw["tp_overlap"])
    except ConfigError as e:
        return _message(f"invalid: {e}")
    if not p.ranked:
        return _message(f"{kw['model']} on {kw['gpus']} x {kw['gpu']}: nothing fits: "
                        f"{binding_constraint(p, cluster)}")
    fig = plot_plan([_label(e) for e in p.ranked], [e.time_breakdown_s for e in p.ranked],
                    [e.mfu for e in p.ranked])
    fig.axes[0].set_title(f"{kw['model']} on {kw['gpus']:,} x {kw['gpu']}, {kw['seq_len']:,}-token "
                          f"sequences, {kw['batch_mtokens']}M tokens:\nthe planner's best "
                          f"({p.tried} layouts tried)", fontsize=9)
    return fig


def _label(e) -> str:
    """A layout and what limits it, as the CLI's plan says it: the largest loss, then the
    largest one that is not the kernels' own efficiency."""
    first, _, then, _, _ = limiting_term(e)
    return f"{describe(e)}: limited by {first}, then {then}"


def _message(text: str):
    fig, ax = plt.subplots(figsize=(10, 1.6))
    ax.axis("off")
    ax.text(0, 0.5, text, color=INVALID, fontsize=9, wrap=True)
    return fig


CONTROLS = {"model": choice(MODELS), "gpu": choice(GPU_NAMES, "GPU"), "gpus": powers(3, 14, "GPUs"),
            "seq_len": powers(11, 17, "sequence"),
            "batch_mtokens": steps([1, 2, 4, 8, 16], "batch (M tok)"),
            "tp_overlap": toggle("--tp-overlap")}


# The settings the HTML book offers (teach/web.py draws each combination when the book is
# built; a plan takes about a second); the other controls stay at DEFAULTS.
WEB = {"gpus": [256, 1024, 4096], "model": list(MODELS), "seq_len": [8192, 32768]}


def explore(**defaults):
    """Controls for the model, the GPU, the number of GPUs, the sequence, the batch, overlap."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
