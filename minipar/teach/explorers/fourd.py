"""The 4D chapter's explorer (book/fourd.md): the planner's ranking as the model, the GPU,
the cluster size, the sequence and the batch change.

Every fitting layout is `costmodel.planner.plan`'s (the function `make test` runs on three
cases), drawn by `figures.fourd.plot_plan`: each of the best layouts as the shares of its
step (compute, TP, CP, bubble, PP, DP, optimizer) with its MFU and what limits it
(`planner.limiting_term`'s largest loss, as the CLI's plan prints it). When nothing fits, the
figure names the constraint that binds (`planner.binding_constraint`) and what to change.
It starts at the chapter's own case: Llama 3 405B on 8,192 H100s with 16M tokens of 8K
(16,384 GPUs is one control move away).
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import ConfigError, ModelConfig
from ...plan.costmodel import GPU_NAMES, binding_constraint, gpu_cluster, plan
from ...plan.costmodel.planner import describe, limiting_term
from ..figures.fourd import plot_plan
from ..style import PAGE_WIDTH
from ..widgets import choice, draw_invalid, explorer, offered, powers, steps, toggle
from .prefetch import Prefetcher

# The chapter's dense models: the planner's MoE presets (the experts chapter) are not what
# this chapter plans.
MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
DEFAULTS = dict(model="llama3-405b", gpu="h100", gpus=8192, seq_len=8192, batch_mtokens=16,
                tp_overlap=False, top=6)
# The figure's box: the same for every setting, so the page's plot keeps its size.
HEIGHT = 4.6
BOX = (0.02, 0.2, 0.96, 0.62)       # the bars' Axes: left, bottom, width, height (fractions)


def ranked(model: str, gpu: str, gpus: int, seq_len: int, tokens: int, top: int, tp_overlap: bool):
    """The planner's result for one setting."""
    return plan(ModelConfig.preset(model), gpu_cluster(gpu), gpus, seq_len, tokens, top=top,
                tp_overlap=tp_overlap)


# Every plan the explorer made, kept; the live explorer also plans the settings one control
# move away while the reader reads (a plan of 405B takes seconds on 2 cores).
PLANS = Prefetcher(ranked)
PLANNED = ("model", "gpu", "gpus", "seq_len", "batch_mtokens", "top", "tp_overlap")


def plan_key(kw: dict) -> tuple:
    """`ranked`'s arguments for a setting."""
    return tuple(int(kw[k] * 2**20) if k == "batch_mtokens" else kw[k] for k in PLANNED)


def neighbours(kw: dict) -> list[tuple]:
    """The plans one control move away from `kw` (the next value of each slider first)."""
    out = []
    for step in (1, -1):
        for name, control in CONTROLS.items():
            values = list(offered(control))
            i = values.index(kw[name]) + step
            if 0 <= i < len(values) and control.kind != "choice":
                out.append(plan_key({**kw, name: values[i]}))
    for name, control in CONTROLS.items():
        if control.kind == "choice":
            out += [plan_key({**kw, name: v}) for v in control.values if v != kw[name]]
    return out


def figure(**values):
    """The planner's `top` layouts for the chosen model, GPU, cluster size, sequence length
    and global batch (millions of tokens, 2**20), best first."""
    kw = {**DEFAULTS, **values}
    where = (f"{kw['model']} on {kw['gpus']:,} x {kw['gpu']}, {kw['seq_len']:,}-token "
             f"sequences, {kw['batch_mtokens']}M tokens")
    try:
        p = PLANS.get(plan_key(kw))
    except ConfigError as e:
        return _message(where, e.problems)
    if not p.ranked:
        return _message(where, ["nothing fits: " + binding_constraint(p, gpu_cluster(kw["gpu"]))])
    fig = plot_plan([_label(e) for e in p.ranked], [e.time_breakdown_s for e in p.ranked],
                    [e.mfu for e in p.ranked])
    fig.set_size_inches(PAGE_WIDTH, HEIGHT)
    ax = fig.axes[0]
    ax.set_position(BOX)
    ax.set_ylim(kw["top"] - 0.6, -0.85)           # a row per place, filled or not
    ax.legend(fontsize=7.5, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    ax.set_title(f"{where}:\nthe planner's best ({p.tried:,} layouts tried)", fontsize=9)
    return fig


def _label(e) -> str:
    """A layout and what limits it, as the CLI's plan says it: the largest loss, then the
    largest one that is not the kernels' own efficiency."""
    first, _, then, _, _ = limiting_term(e)
    return f"{describe(e)}: limited by {first}, then {then}"


def _message(where: str, problems: list[str]):
    """Why nothing is drawn, in the figure's own box (each line says what to change)."""
    fig = plt.figure(figsize=(PAGE_WIDTH, HEIGHT))
    ax = fig.add_axes(BOX)
    ax.set_title(where, fontsize=9)
    draw_invalid(ax, problems, None)
    return fig


CONTROLS = {"model": choice(MODELS), "gpu": choice(GPU_NAMES, "GPU"), "gpus": powers(3, 14, "GPUs"),
            "seq_len": powers(11, 17, "sequence"),
            "batch_mtokens": steps([1, 2, 4, 8, 16], "batch (M tok)"),
            "tp_overlap": toggle("--tp-overlap")}


# The settings the HTML book offers (teach/web.py draws each ahead of time; a plan takes a
# second or more): every model, each with every value of the other controls one at a time,
# so from the chapter's case (405B on 8,192 H100s, 16M tokens) 16,384 GPUs is one move.
WEB = {"model": list(MODELS)}
ALONE = {name: list(offered(CONTROLS[name]))
         for name in ("gpu", "gpus", "seq_len", "batch_mtokens", "tp_overlap")}


def explore(**defaults):
    """Controls for the model, the GPU, the number of GPUs, the sequence, the batch, overlap;
    once each redraw is shown the plans one move away are computed in the background (not
    before: a guess planned beside the picture being drawn slows the one the reader waits for)."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3,
                    shown=lambda **values: PLANS.warm(neighbours(values)))
