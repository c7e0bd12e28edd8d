"""The explorers of the HTML book: every chapter's `figure`, drawn ahead of time for the
settings its page offers, as data a browser can draw again (book/_static/minipar-explorer.js,
with Plotly).

A static page has no kernel, so the book computes the pictures when it is built. What it
ships is not a picture but what the picture is made of: for each Axes of the matplotlib
Figure its place, limits, scales, ticks, lines, boxes and texts, read back from the artists
`figure` made (`figure_data`). Nothing here knows any chapter: the same reading serves a
Gantt chart and a loss curve, so the browser draws exactly the numbers `figure` drew.

Each explorer module names the settings its page offers in `WEB` (control name -> the
values offered); `payload(chapter)` draws every combination of them (`settings`). The
module names its other controls in `ALONE` (name -> values): each of them moves one at a
time from its DEFAULTS value, with every combination of `WEB` (a full product of a dozen
controls would be millions of pictures). Between them the page offers every control of the
notebook's explorer over the notebook's range: every value of a list, a number slider's
ends, its default and a few values between (tests/test_explorers_web.py holds each chapter
to that), and the DEFAULTS, the chapter's own case, are the first setting shown. A
module's `same_picture(values)`, if any, maps a setting to one that draws the same picture
(a control the picture ignores at that setting), so it is drawn once.
"""
from __future__ import annotations

import importlib
import itertools
import math
import re

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer
from matplotlib.patches import Rectangle

from .widgets import FIT_CONTROLS, WHATIF_CONTROLS

CHAPTERS = ("cluster", "collectives", "context_parallel", "data_parallel", "experts", "failures",
            "fourd", "hf", "llama3", "memory", "mfu", "pipeline_parallel", "tensor_parallel")
DIGITS = 6          # significant digits of every number shipped: the browser needs no more
MAX_FRAMES = 700    # a page's settings: each costs build time (the browser loads only those shown)


# ---------------------------------------------------------------- numbers, colours, texts
def _num(v):
    """A float rounded to DIGITS significant digits; NaN and infinities (a gap in a line)
    become None, which JSON and JavaScript both read as a missing point."""
    v = float(v)
    return float(f"{v:.{DIGITS}g}") if math.isfinite(v) else None


def _nums(values) -> list:
    return [_num(v) for v in values]


def _color(c) -> str | None:
    """'#rrggbb', or None for no colour (an unfilled box, a transparent edge)."""
    if c is None or (isinstance(c, str) and c == "none"):
        return None
    rgba = matplotlib.colors.to_rgba(c)
    return None if rgba[3] == 0 else to_hex(rgba, keep_alpha=False)


def _plain(text: str) -> str:
    """Tick labels of a log axis are mathtext ($\\mathdefault{10^{3}}$): keep what they say,
    10^{3}, without the markup; the browser raises the exponent."""
    return re.sub(r"\$\\mathdefault\{(.*?)\}\$", r"\1", text).replace("\u2212", "-")


# ---------------------------------------------------------------- one Figure -> data
def figure_data(fig) -> dict:
    """Everything a browser needs to draw `fig` again: its size and, per Axes, the place,
    limits, scales, ticks, lines, boxes and texts; then the figure's own texts."""
    fig.draw_without_rendering()    # tick labels and text places are final only after a draw
    width, height = fig.get_size_inches()
    return {"size": _nums([width, height]),
            "axes": [_axes(ax, fig) for ax in fig.axes if ax.get_visible()],
            "texts": [_text(t, fig) for t in _figure_texts(fig)]}


def _figure_texts(fig) -> list:
    texts = list(fig.texts)
    if fig._suptitle is not None and fig._suptitle not in texts:   # noqa: SLF001 - no getter
        texts.append(fig._suptitle)                                 # noqa: SLF001
    return [t for t in texts if t.get_visible() and t.get_text()]


def _axes(ax, fig) -> dict:
    box = ax.get_position()
    return {"position": _nums([box.x0, box.y0, box.width, box.height]),
            "visible": bool(ax.axison),
            "x": _axis(ax, "x"), "y": _axis(ax, "y"),
            "title": [_text(t, fig) for t in _titles(ax) if t.get_text()],
            "lines": [_line(ln, ax) for ln in ax.get_lines() if ln.get_visible()],
            "shapes": _shapes(ax),
            "texts": [_text(t, fig) for t in ax.texts if t.get_visible() and t.get_text()],
            "legend": _legend(ax, fig)}


def _titles(ax) -> tuple:
    """The centre, left and right titles: matplotlib has no getter for the Text of each."""
    return ax.title, ax._left_title, ax._right_title          # noqa: SLF001


def _axis(ax, which: str) -> dict:
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = ax.get_xlim() if which == "x" else ax.get_ylim()
    ticks, labels = [], []
    for tick, label in zip(axis.get_majorticklocs(), axis.get_majorticklabels()):
        if min(lo, hi) <= tick <= max(lo, hi) and label.get_visible():   # only those shown
            ticks.append(tick)
            labels.append(_plain(label.get_text()))
    return {"limits": _nums([lo, hi]), "scale": axis.get_scale(), "label": axis.get_label_text(),
            "ticks": _nums(ticks), "ticklabels": labels}


def _to_data(transform, ax, points):
    """`points` drawn with `transform`, in the Axes' data coordinates: axhline and axvline
    give one of x, y as a fraction of the Axes, a box may be drawn in any."""
    if transform is ax.transData:
        return points
    return ax.transData.inverted().transform(transform.transform(points))


def _line(line, ax) -> dict:
    xy = _to_data(line.get_transform(), ax, line.get_xydata())
    return {"x": _nums(xy[:, 0]), "y": _nums(xy[:, 1]), "color": _color(line.get_color()),
            "width": _num(line.get_linewidth()), "style": line.get_linestyle(),
            "marker": str(line.get_marker()), "markersize": _num(line.get_markersize()),
            "alpha": _num(line.get_alpha() if line.get_alpha() is not None else 1),
            "label": _label(line.get_label())}


def _label(label) -> str:
    """A legend's name; matplotlib's '_child3' and '_nolegend_' mean none."""
    label = str(label or "")
    return "" if label.startswith("_") else label


def _shapes(ax) -> list[dict]:
    """Every box (bars, Gantt boxes) and other patch as a polygon in data coordinates, with
    the name of the bars it belongs to (a BarContainer's label) when it has one."""
    named = {id(p): _label(c.get_label()) for c in ax.containers
             if isinstance(c, BarContainer) for p in c.patches}
    out = []
    for patch in ax.patches:
        if not patch.get_visible():
            continue
        shape = {"facecolor": _color(patch.get_facecolor()) if patch.get_fill() else None,
                 "edgecolor": _color(patch.get_edgecolor()),
                 "label": named.get(id(patch)) or _label(patch.get_label())}
        if isinstance(patch, Rectangle) and patch.get_data_transform() is ax.transData \
                and patch.get_angle() == 0:
            shape.update(kind="rect", x=_num(patch.get_x()), y=_num(patch.get_y()),
                         width=_num(patch.get_width()), height=_num(patch.get_height()))
        else:
            path = patch.get_path().transformed(patch.get_patch_transform())
            xy = _to_data(patch.get_data_transform(), ax, path.vertices)
            shape.update(kind="polygon", x=_nums(xy[:, 0]), y=_nums(xy[:, 1]))
        out.append(shape)
    return out


# What most texts are; a text's data leaves out what it shares with them (a Gantt chart has
# a label per box: this halves the bytes of its frames). The browser fills them back in.
TEXT_DEFAULTS = {"color": "#000000", "ha": "left", "va": "baseline", "rotation": 0.0,
                 "bold": False}


def _text(text, fig) -> dict:
    """A text where it stands on the figure (fractions of its width and height)."""
    x, y = fig.transFigure.inverted().transform(
        text.get_transform().transform(text.get_unitless_position()))
    full = {"text": _plain(text.get_text()), "x": _num(x), "y": _num(y),
            "size": _num(text.get_fontsize()), "color": _color(text.get_color()),
            "ha": text.get_horizontalalignment(), "va": text.get_verticalalignment(),
            "rotation": _num(text.get_rotation()),
            "bold": text.get_fontweight() in ("bold", 700, "heavy")}
    return {k: v for k, v in full.items() if k not in TEXT_DEFAULTS or v != TEXT_DEFAULTS[k]}


def _legend(ax, fig) -> dict | None:
    """The legend: its box on the figure (x0, y0, x1, y1 in fractions), its columns, and
    its entries (name and colour) in order."""
    legend = ax.get_legend()
    if legend is None:
        return None
    entries = []
    for handle, text in zip(legend.legend_handles, legend.get_texts()):
        colour = handle.get_color() if hasattr(handle, "get_marker") else handle.get_facecolor()
        entries.append({"label": text.get_text(), "color": _color(colour)})
    box = legend.get_window_extent().transformed(fig.transFigure.inverted())
    columns = legend._ncols                                     # noqa: SLF001 - no getter
    return {"box": _nums([box.x0, box.y0, box.x1, box.y1]), "columns": columns,
            "entries": entries}


# ---------------------------------------------------------------- a chapter's settings
def explorer(chapter: str):
    """The module minipar.teach.explorers.<chapter>."""
    if chapter not in CHAPTERS:
        raise ValueError(f"no explorer {chapter!r}; one of {CHAPTERS}")
    return importlib.import_module(f"minipar.teach.explorers.{chapter}")


def controls(chapter: str) -> dict:
    """The chapter's controls (the memory and MFU explorers share teach.widgets')."""
    module = explorer(chapter)
    return getattr(module, "CONTROLS", None) or {"memory": FIT_CONTROLS,
                                                 "mfu": WHATIF_CONTROLS}[chapter]


def grid(chapter: str) -> dict[str, list]:
    """The settings the chapter's page offers: control name -> the values offered, those of
    `WEB` (every combination) and of `ALONE` (one at a time), in the order of the notebook's
    controls (so the page shows them as the notebook does)."""
    offered = {**explorer(chapter).WEB, **alone(chapter)}
    order = [name for name in controls(chapter) if name in offered]
    order += [name for name in offered if name not in order]     # the tests name these
    return {name: list(offered[name]) for name in order}


def alone(chapter: str) -> dict[str, list]:
    """The controls the page moves one at a time (the module's `ALONE`, if any)."""
    return {name: list(values) for name, values in getattr(explorer(chapter), "ALONE", {}).items()}


def settings(chapter: str, start: dict | None = None):
    """(key, values) for every setting the page offers: each combination of `WEB`, with at
    most one `ALONE` control moved from its default; the rest of the values at the module's
    DEFAULTS updated by `start`. The key is the index of each value in its list, joined by
    commas ("0,2,1"): what the page looks up when a control moves."""
    offered, base = grid(chapter), {**explorer(chapter).DEFAULTS, **(start or {})}
    single = alone(chapter)
    home = {name: offered[name].index(base[name]) for name in single}
    moves = [dict(home)] + [{**home, name: i} for name in single
                            for i in range(len(single[name])) if i != home[name]]
    product = [name for name in offered if name not in single]
    for index in itertools.product(*(range(len(offered[name])) for name in product)):
        for move in moves:
            chosen = {**dict(zip(product, index)), **move}
            yield (",".join(str(chosen[name]) for name in offered),
                   {**base, **{name: offered[name][i] for name, i in chosen.items()}})


def frame(chapter: str, values: dict) -> dict:
    """`figure_data` of the chapter's figure at `values`; the figure is closed after."""
    fig = explorer(chapter).figure(**values)
    try:
        return figure_data(fig)
    finally:
        plt.close(fig)


def payload(chapter: str, start: dict | None = None, keys=None) -> dict:
    """What the chapter's page ships: its controls (name, label, kind, offered values, and
    whether it moves alone), the key of the frame shown first (`start`'s values, else the
    DEFAULTS) and every frame with the values it was drawn for (only those of `keys`, when
    given: the tests' shortcut)."""
    offered, all_controls, single = grid(chapter), controls(chapter), alone(chapter)
    base = {**explorer(chapter).DEFAULTS, **(start or {})}
    first = ",".join(str(offered[name].index(base[name])) for name in offered)
    same = getattr(explorer(chapter), "same_picture", lambda values: values)
    frames, values, drawn = {}, {}, {}
    for key, setting in settings(chapter, start):
        if keys is None or key in keys:
            # settings the module says draw the same picture are drawn once
            canonical = repr(sorted(same(setting).items()))
            if canonical not in drawn:
                drawn[canonical] = frame(chapter, setting)
            frames[key], values[key] = drawn[canonical], setting
    return {"chapter": chapter, "first": first, "base": base, "values": values, "frames": frames,
            "controls": [{"name": name, "label": all_controls[name].label or name,
                          "kind": all_controls[name].kind, "values": vals,
                          "alone": name in single}
                         for name, vals in offered.items()]}
