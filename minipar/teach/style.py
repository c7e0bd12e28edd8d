"""Every chapter's figures: one colour per name, and the drawing helpers several share.

One table, `COLORS`, gives each thing the book draws its colour wherever it appears: the four
axes, the memory parts (parameters, gradients, optimizer state, activations), the pipeline's
F/B/W passes, the collectives, the failure categories. Two figures that show the same thing
show it in the same colour.
"""
from __future__ import annotations

import matplotlib
from matplotlib.colors import to_rgb

# Figures saved as SVG (the book's, and the notebooks', which ask the inline backend for SVG)
# keep their text as text: sharp at any screen's resolution, a quarter of the bytes of glyphs
# drawn as paths, and sizes the HTML check can read (no text under 9 px on a phone). A fixed
# salt gives the same ids to the same figure, so a notebook run again changes no picture.
SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "minipar"}
matplotlib.rcParams.update(SVG_RC)

BLUE, ORANGE, GREEN, RED, PURPLE = "#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2"
GREY, BROWN, DARK_GREY, INVALID = "#999999", "#937860", "#8C8C8C", "#B00020"

COLORS = {
    # the four axes, innermost first
    "tp": BLUE, "cp": GREEN, "pp": RED, "dp": PURPLE,
    # where a step's time goes (tp's share sits next to compute, so a lighter blue)
    "compute": BLUE, "tp time": "#8C9FCA", "bubble": "#CCCCCC",
    # what one GPU holds
    "params": BLUE, "grads": ORANGE, "optimizer": GREEN, "activations": RED,
    # compute passes: a forward, a backward; the pipeline's F, B (input grad), W (weight grad)
    "forward": BLUE, "backward": ORANGE, "F": BLUE, "B": ORANGE, "W": GREEN,
    "sync": GREEN,   # a bucket's gradient all-reduce on the overlap timeline
    # collectives
    "all_reduce": BLUE, "reduce_scatter": ORANGE, "all_gather": GREEN,
    # context parallelism: K/V by ring or all-gather; the naive and the balanced layout
    "ring": BLUE, "allgather": ORANGE, "ulysses": PURPLE, "contiguous": RED, "zigzag": GREEN,
    # a published or measured number drawn next to a prediction
    "reference": GREY,
    # failure categories of Llama 3's Table 5
    "GPU": RED, "Dependency": PURPLE, "Network": BLUE, "Unplanned Maintenance": BROWN,
    "Host": GREEN, "Unknown": DARK_GREY,
}

# The page every figure is drawn for: the book's text column is 672 px at 1280 px, about
# 7 inches at the screen's 96 px per inch. A figure PAGE_WIDTH wide is shown near its own
# size, so its smallest text, SMALL points, reads at 9 px or more (tests/test_book.py
# checks every figure of the book); a wider figure is shrunk and its text with it.
PAGE_WIDTH = 7.0
SMALL = 7

AXES = ("tp", "cp", "pp", "dp")
AXIS_NAMES = {"tp": "tensor (TP)", "cp": "context (CP)", "pp": "pipeline (PP)", "dp": "data (DP)"}
MEMORY_PARTS = ("params", "grads", "optimizer")
FAILURE_CATEGORIES = ("GPU", "Dependency", "Network", "Unplanned Maintenance", "Host", "Unknown")


def lighter(colour: str, amount: float) -> tuple:
    """`colour` mixed with white: amount 0 keeps it, 1 is white."""
    return tuple(c + (1 - c) * amount for c in to_rgb(colour))


def stacked_bars(ax, parts: dict, labels: dict | None = None, x=None, **bar) -> list:
    """Bars stacked part on part: `parts` is {part: [value per bar]}, drawn bottom-up in its
    order, each part in COLORS[part] and labelled once for the legend (labels[part] if given,
    else the part's name). Returns the height of each bar."""
    n = len(next(iter(parts.values()), []))
    x = list(range(n)) if x is None else x
    bottom = [0.0] * n
    for part, values in parts.items():
        ax.bar(x, values, bottom=bottom, color=COLORS[part], label=(labels or {}).get(part, part),
               **bar)
        bottom = [b + v for b, v in zip(bottom, values)]
    return bottom


def log2_ticks(ax, ticks, xlabel: str, labels=None):
    """A base-2 log x axis with a tick (labelled by `labels`, default the number) at each of
    `ticks`: the degrees of parallelism and sequence lengths the book sweeps by doubling."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks))
    ax.set_xticklabels(labels if labels is not None else [str(t) for t in ticks])
    ax.set_xlabel(xlabel)


def formula_marks(ax, values: dict, label: str = "formula"):
    """A short black bar across bar x at height values[x], for each x in `values`: what a
    formula expects that bar to reach."""
    for k, (x, v) in enumerate(values.items()):
        ax.plot([x - 0.4, x + 0.4], [v] * 2, color="black", linewidth=2,
                label=label if k == 0 else None)

