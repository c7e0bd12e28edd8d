"""The context-parallel chapter's explorer (book/context_parallel.md): a CP layout, by
degree cp, implementation (ring, all-gather, Ulysses) and sequence length, in work per
rank and bytes per rank.

Everything comes from the chapter's functions: the layout and the work each rank does
from `parallel.context` (`attention_work` counts the scores of the ring's schedule), the
bytes from `formulas.cp_wire_bytes_per_step` (Llama 3 405B's shapes, bf16, TP8 by
default). The page shows the default: Table 4's long-context row, CP16 at 131,072 tokens.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import ModelConfig
from ...plan.formulas.context_parallel import cp_wire_bytes_per_step
from ...trainer.parallel.context_analysis import attention_work
from ..figures.context_parallel import CP_LAYOUTS, plot_cp_layout
from ..style import COLORS, INVALID, PAGE_WIDTH, log2_ticks
from ..widgets import choice, explorer, powers, steps

IMPLS = ("ring", "allgather", "ulysses")
DEFAULTS = dict(cp=16, impl="allgather", seq_len=131072, layout="zigzag", model="llama3-405b",
                tp=8)


def _layer_mb(model, seq, cp, impl, tp):
    """MB one rank sends for one layer and one sequence, forward and backward, bf16."""
    return cp_wire_bytes_per_step(model, 1, seq, cp, impl, tp=tp, n_layers=1, dtype_bytes=2) / 1e6


def _ulysses_ok(model, cp, tp):
    return (model.n_heads // tp) % cp == 0


def _draw_work(ax, kw):
    seq, cp = kw["seq_len"], kw["cp"]
    for name, chunks in CP_LAYOUTS.items():
        work = attention_work(seq, cp, chunks)
        fair = sum(work) / cp
        ax.plot(range(cp), [w / fair for w in work], marker="o", markersize=3,
                color=COLORS[name], linewidth=2.5 if name == kw["layout"] else 1, label=name)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("CP rank")
    ax.set_ylabel("attention work / fair share")
    ax.set_title("work per rank (the ring's schedule)", fontsize=9)
    ax.legend(fontsize=7)


def _draw_bytes(ax, kw, model):
    cps = [2**i for i in range(1, 7)]
    for impl in IMPLS:
        ok = [c for c in cps if impl != "ulysses" or _ulysses_ok(model, c, kw["tp"])]
        ax.plot(ok, [_layer_mb(model, kw["seq_len"], c, impl, kw["tp"]) for c in ok],
                marker="o", markersize=3, color=COLORS[impl],
                linewidth=2.5 if impl == kw["impl"] else 1, label=impl)
    ax.axvline(kw["cp"], color="grey", linestyle=":")
    log2_ticks(ax, cps, "cp")
    ax.set_yscale("log")
    ax.set_ylabel("MB sent per rank per layer")
    ax.set_title(f"bytes per rank, {kw['seq_len']:,} tokens", fontsize=9)
    ax.legend(fontsize=7)


def figure(**values):
    """The layout's causal blocks (cp capped at 8 to stay legible), the work per rank of
    both layouts, and each implementation's bytes per rank against cp. Pure."""
    kw = {**DEFAULTS, **values}
    model = ModelConfig.preset(kw["model"])
    fig = plt.figure(figsize=(PAGE_WIDTH, 6.6))       # layout and work above, bytes below
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 1.2])
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    plot_cp_layout(min(kw["cp"], 8), kw["layout"], axes[0])
    _draw_work(axes[1], kw)
    _draw_bytes(axes[2], kw, model)
    title = (f"{model.name}, TP{kw['tp']}, CP{kw['cp']} {kw['impl']}, {kw['layout']} layout, "
             f"{kw['seq_len']:,} tokens\n")
    if kw["seq_len"] % (2 * kw["cp"]):
        title += f": refused, {kw['seq_len']:,} is not divisible by 2 cp"
    elif kw["impl"] == "ulysses" and not _ulysses_ok(model, kw["cp"], kw["tp"]):
        title += f": refused, {model.n_heads // kw['tp']} heads per TP rank cannot be split {kw['cp']} ways"
    else:
        title += f": {_layer_mb(model, kw['seq_len'], kw['cp'], kw['impl'], kw['tp']):,.0f} MB per rank per layer"
    fig.suptitle(title, fontsize=9, color=INVALID if "refused" in title else "black")
    fig.tight_layout()
    return fig


CONTROLS = {"cp": powers(1, 6), "impl": choice(IMPLS), "seq_len": powers(11, 20, "seq len"),
            "layout": choice(CP_LAYOUTS), "tp": steps([1, 2, 4, 8])}


# The settings the HTML book offers (teach/web.py draws each combination when the book is
# built); the other controls stay at DEFAULTS.
WEB = {"cp": [2, 4, 8, 16, 32], "impl": list(IMPLS), "seq_len": [32768, 131072]}


def explore(**defaults):
    """Sliders for cp, the implementation, the sequence length, the layout and TP."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
