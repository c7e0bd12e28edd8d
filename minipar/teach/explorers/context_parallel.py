"""The context-parallel chapter's explorer (book/context_parallel.md): a CP layout, by
degree cp, implementation (ring, all-gather, Ulysses) and sequence length, in work per
rank and bytes per rank.

Everything comes from the chapter's functions: the layout and the work each rank does
from `parallel.context` (`attention_work` counts the scores of the ring's schedule), the
bytes from `formulas.cp_wire_bytes_per_step` (Llama 3 405B's shapes, bf16, TP8 by
default). The page shows the default: Table 4's long-context row, CP16 at 131,072 tokens.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.patches import Polygon
from matplotlib.ticker import FuncFormatter, LogLocator

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
    ax.legend(fontsize=7, loc="upper left")


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
    # ticks at 1, 2 and 5 of each decade: the lines often span less than one decade
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
    ax.set_ylabel("MB sent per rank per layer")
    ax.set_title(f"bytes per rank, {kw['seq_len']:,} tokens", fontsize=9)
    ax.legend(fontsize=7, loc="best")


DRAWN_BLOCKS = 8     # above this cp, each query chunk's blocks are drawn as one band


def _draw_layout(ax, cp: int, layout: str):
    """The causal blocks of `layout` at the chosen cp: `figures.context_parallel.plot_cp_layout`
    up to cp = 8; above, each query chunk's row (its blocks merged: hundreds of squares
    would hide the pattern) in its rank's colour, with the same title."""
    if cp <= DRAWN_BLOCKS:
        plot_cp_layout(cp, layout, ax)
        return
    n, chunks = 2 * cp, CP_LAYOUTS[layout]
    owner = {ch: r for r in range(cp) for ch in chunks(r, cp)}
    cmap = plt.get_cmap("viridis")
    for q in range(n):
        ax.add_patch(Polygon([(0, q), (q, q), (q + 1, q + 1), (0, q + 1)], closed=True,
                             facecolor=cmap(owner[q] / (cp - 1)), edgecolor="none"))
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    every = [i for i in range(0, n + 1, n // 4)]
    ax.set_xticks(every)
    ax.set_yticks(every)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk (colour: its rank)")
    work = attention_work(2 * cp * 64, cp, chunks)
    ax.set_title(f"{layout}, cp={cp}: busiest / idlest rank = {max(work) / min(work):.2f}",
                 fontsize=9)


def figure(**values):
    """The layout's causal blocks at the chosen cp, the work per rank of both layouts, and
    each implementation's bytes per rank against cp. Pure."""
    kw = {**DEFAULTS, **values}
    model = ModelConfig.preset(kw["model"])
    fig = plt.figure(figsize=(PAGE_WIDTH, 6.6))       # layout and work above, bytes below
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 1.2])
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    _draw_layout(axes[0], kw["cp"], kw["layout"])
    _draw_work(axes[1], kw)
    _draw_bytes(axes[2], kw, model)
    title = (f"{model.name}, TP{kw['tp']}, CP{kw['cp']} {kw['impl']}, {kw['layout']} layout, "
             f"{kw['seq_len']:,} tokens\n")
    if kw["seq_len"] % (2 * kw["cp"]):
        title += (f"refused: {kw['seq_len']:,} tokens do not split into 2 cp = {2 * kw['cp']} "
                  "chunks; choose a smaller cp or a longer sequence")
    elif kw["impl"] == "ulysses" and not _ulysses_ok(model, kw["cp"], kw["tp"]):
        heads = model.n_heads // kw["tp"]
        title += (f"refused: Ulysses splits the {heads} heads of a TP rank over cp, and {heads} "
                  f"is not a multiple of cp = {kw['cp']}; choose cp <= {heads}, a smaller TP, or ring")
    else:
        title += f"{_layer_mb(model, kw['seq_len'], kw['cp'], kw['impl'], kw['tp']):,.0f} MB per rank per layer"
    head, _, why = title.partition("\n")
    title = head + "\n" + textwrap.fill(why, 95)       # a page does not wrap a figure's text
    fig.suptitle(title, fontsize=9, color=INVALID if "refused" in title else "black")
    fig.tight_layout()
    return fig


CONTROLS = {"cp": powers(1, 6), "impl": choice(IMPLS), "seq_len": powers(11, 20, "seq len"),
            "layout": choice(CP_LAYOUTS), "tp": steps([1, 2, 4, 8])}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every cp, each
# with every value of the other controls one at a time (both layouts' work is drawn at each).
WEB = {"cp": list(CONTROLS["cp"].values)}
ALONE = {name: list(CONTROLS[name].values) for name in ("impl", "seq_len", "layout", "tp")}


def explore(**defaults):
    """Sliders for cp, the implementation, the sequence length, the layout and TP."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
