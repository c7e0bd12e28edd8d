"""Figures of Chapter "How good is the cost model" (the appendix): every published run's
prediction against its publication, and the signed errors source by source.

Drawn from `python -m minipar.costmodel.evaluate`'s rows as `numbers.accuracy` holds them
(`evaluation`): nothing recomputed here. One colour per source, the same in both figures.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.costmodel.calibration import held_out_runs
from ...plan.costmodel.evaluate import memory_bound, residuals
from ..numbers.accuracy import NEAR, SOURCES, evaluation
from ..style import BLUE, GREEN, GREY, ORANGE, PAGE_WIDTH, SMALL

SOURCE_COLORS = {"table4": BLUE, "playbook": ORANGE, "nemo": GREEN}
SOURCE_NAMES = {"table4": "Llama 3's Table 4 (llama3)", "playbook": "the Ultra-Scale Playbook (nanotron)",
                "nemo": "NVIDIA's NeMo recipes (nemo)"}


def _by_source() -> dict[str, list[tuple[float, float, bool]]]:
    """{source's short name: [(published %, error in points, memory-bound), ...]}."""
    runs, res = evaluation()
    out: dict[str, list] = {}
    for run, r in zip(runs, res):
        out.setdefault(SOURCES[run.source], []).append((100 * run.mfu, r, memory_bound(run)))
    return out


def predicted_vs_published():
    """Each evaluation row's predicted MFU over its published one (minipar's FLOP count), a
    colour per source, the memory-bound row open; the heatmap's other cells as grey rings;
    the line y = x and NEAR points either side of it."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH - 1.5, PAGE_WIDTH - 2))
    held = held_out_runs()
    held_points = [(100 * r.mfu, 100 * r.mfu + e) for r, e in zip(held, residuals(held))]
    top = 70
    ax.fill_between([0, top], [-NEAR, top - NEAR], [NEAR, top + NEAR], color="0.92",
                    label=f"within {NEAR:g} points")
    ax.plot([0, top], [0, top], color="0.4", lw=0.8, label="predicted = published")
    ax.scatter(*zip(*held_points), s=22, facecolors="none", edgecolors=GREY,
               label="the heatmap's other cells")
    for name, rows in _by_source().items():
        kept = [(p, p + e) for p, e, mb in rows if not mb]
        ax.scatter(*zip(*kept), s=30, color=SOURCE_COLORS[name], label=SOURCE_NAMES[name], zorder=3)
        for p, e, _ in (row for row in rows if row[2]):
            ax.scatter([p], [p + e], s=40, facecolors="none", edgecolors=SOURCE_COLORS[name], zorder=3,
                       label="memory-bound, its source says")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="published MFU (%, minipar's count)",
           ylabel="predicted MFU (%)", aspect="equal")
    ax.set_title("the cost model against published runs", fontsize=9)
    ax.legend(fontsize=SMALL, loc="upper left")
    fig.tight_layout()
    return fig


def residuals_by_source():
    """The signed error (predicted - published, MFU points) of every row, a column per
    source, each source's mean signed error as a bar across its column; the memory-bound row
    open, beyond the axis if it must be, with its value written."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.2))
    groups = _by_source()
    limit = 12
    for x, (name, rows) in enumerate(groups.items()):
        kept = [e for _, e, mb in rows if not mb]
        xs = [x + 0.25 * ((i % 7) - 3) / 3 for i in range(len(kept))]
        ax.scatter(xs, kept, s=26, color=SOURCE_COLORS[name], zorder=3)
        mean = sum(kept) / len(kept)
        ax.plot([x - 0.35, x + 0.35], [mean, mean], color="black", lw=1.5)
        ax.text(x + 0.38, mean, f"mean {mean:+.1f}", va="center", fontsize=SMALL)
        for _, e, _ in (row for row in rows if row[2]):
            ax.scatter([x], [min(e, limit - 0.5)], s=36, facecolors="none",
                       edgecolors=SOURCE_COLORS[name], zorder=3)
            ax.text(x + 0.08, limit - 0.5, f"{e:+.1f} (memory-bound)", va="center", fontsize=SMALL)
    ax.axhline(0, color="0.4", lw=0.8)
    ax.axhspan(-NEAR, NEAR, color="0.92", zorder=0)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([SOURCE_NAMES[n].replace(" (", "\n(") for n in groups], fontsize=SMALL + 1)
    ax.set_xlim(-0.6, len(groups) - 0.1)
    ax.set_ylim(-limit, limit)
    ax.set_ylabel("predicted − published (points)")
    ax.set_title(f"signed errors by source (grey: within {NEAR:g} points)", fontsize=9)
    fig.tight_layout()
    return fig
