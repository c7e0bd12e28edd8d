"""Figures of the failures chapter: what interrupts a long run, and what it costs.

Llama 3's interruptions by root cause (checking the published percentages against their
counts), the time lost against the checkpoint interval with each curve's optimum, and loss
curves that show a resumed run continues the one that failed.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np

import torch

from ...plan.formulas.failures import expected_waste, young_interval
from ...trainer.grid import ProcessGrid
from ...trainer.parallel.zero import FlatShards
from ...trainer.placement import Shard, local_index
from ..numbers import failures as facts
from ..numbers.failures import broken_commit, crash_table, safe_commit
from ..style import COLORS, FAILURE_CATEGORIES, PAGE_WIDTH, SMALL


def plot_interruptions(rows=None, ax=None):
    """Interruptions per root cause, from (component, category, count, percent) rows
    (default: the paper's Table 5): bars of the counts coloured by category, each labelled
    with the printed percentage and the percentage its count implies."""
    rows = facts.TABLE5 if rows is None else rows
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.8, 4.6))
    total = sum(r[2] for r in rows)
    names = [r[0] for r in rows][::-1]
    counts = [r[2] for r in rows][::-1]
    colors = [COLORS.get(r[1], "grey") for r in rows][::-1]
    ax.barh(names, counts, color=colors)
    for y, (count, pct) in enumerate(zip(counts, [r[3] for r in rows][::-1])):
        implied = 100 * count / total
        flag = "  <- printed != count" if abs(implied - pct) > 0.05 else ""
        ax.text(count + 2, y, f"{count}: {pct}% printed, {implied:.1f}% of {total}{flag}",
                va="center", fontsize=7)
    for cat in FAILURE_CATEGORIES:
        ax.barh([names[0]], [0], color=COLORS[cat], label=cat)
    ax.set_xlim(0, max(counts) * 2.15)
    ax.set_xlabel("unexpected interruptions in 54 days")
    ax.legend(fontsize=7, loc="lower right", title="category", title_fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    return ax


def plot_checkpoint_waste(intervals_s, waste: dict, optima: dict, ax=None):
    """Fraction of time lost against the checkpoint interval, one curve per write time;
    `optima` marks each curve's best interval (label -> interval in seconds)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    minutes = [t / 60 for t in intervals_s]
    for label, w in waste.items():
        line, = ax.plot(minutes, [100 * x for x in w], label=label)
        best = optima[label]
        i = min(range(len(intervals_s)), key=lambda j: abs(intervals_s[j] - best))
        ax.plot([best / 60], [100 * w[i]], "o", color=line.get_color())
        ax.annotate(f"{best / 60:.0f} min", (best / 60, 100 * w[i]), textcoords="offset points",
                    xytext=(4, 6), fontsize=8, color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("time lost (%)")
    ax.set_ylim(0, 60)
    ax.legend(fontsize=8)
    return ax


def llama3_waste_curves(intervals_s=None):
    """(intervals, {label: waste per interval}, {label: Young's interval}) for Llama 3 405B's
    checkpoint (`numbers.failures.checkpoint_bytes`) at the job's MTBF: written at Tectonic's
    2 TB/s, at a tenth of it, and a five-minute stall."""
    intervals = list(np.geomspace(20, 4 * 3600, 300)) if intervals_s is None else intervals_s
    fast = facts.checkpoint_bytes() / (facts.TECTONIC_TBps * 1e12)
    writes = {f"write {fast:.1f} s (2 TB/s)": fast, f"write {10 * fast:.0f} s (200 GB/s)": 10 * fast,
              "write 300 s (a stall)": 300.0}
    m = facts.mtbf_s()
    waste = {k: [expected_waste(t, d, m) for t in intervals] for k, d in writes.items()}
    return intervals, waste, {k: young_interval(d, m) for k, d in writes.items()}


def plot_llama3_waste():
    """Time lost against the checkpoint interval for Llama 3 405B (`llama3_waste_curves`)."""
    ax = plot_checkpoint_waste(*llama3_waste_curves())
    ax.set_title(f"Llama 3 405B, one failure every {facts.mtbf_s() / 3600:.1f} h: writing "
                 "(left) against redoing (right)", fontsize=9)
    return ax


def plot_restart_curves(curves: dict, events: dict | None = None, ax=None):
    """Loss curves given as label -> (steps, losses); the first is drawn wide underneath so
    that coinciding curves show as coinciding. `events`: label -> step, drawn as vertical
    lines (a failure, a resume)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    markers = "os^vD"
    for k, (label, (steps, losses)) in enumerate(curves.items()):
        if k == 0:
            ax.plot(steps, losses, color="lightgrey", linewidth=6, label=label, zorder=1)
        else:
            ax.plot(steps, losses, marker=markers[k % len(markers)], markersize=4, linewidth=1,
                    label=label, zorder=2)
    for k, (label, step) in enumerate((events or {}).items()):
        ax.axvline(step, color="black", linestyle=[":", "--", "-."][k % 3], linewidth=1, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return ax


def plot_commit_protocol():
    """A checkpoint commit crashed at every moment, the safe protocol against a broken one:
    a row per moment (between operations, and in the middle of each write), what a resume
    would find (latest's content, the directories), green where it can trust it and red
    where it cannot. Drawn from `numbers.failures.crash_table`, what `check_commit` runs.
    The safe protocol above, the broken one below."""
    tables = [crash_table(commit) for commit in (safe_commit, broken_commit)]
    fig, axes = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 0.5 + 0.17 * sum(map(len, tables))),
                             gridspec_kw={"height_ratios": [len(t) for t in tables]})
    for ax, title, rows in zip(axes, ("the protocol of checkpoint.save", "a broken commit"),
                               tables):
        for y, (when, files, wrong) in enumerate(rows):
            colour = "#D8EED8" if wrong is None else "#F6D0D0"
            ax.add_patch(plt.Rectangle((0, -y - 1), 1, 1, color=colour, transform=ax.transData))
            latest = files.get("ckpt/latest", "-").strip() or "(empty)"
            dirs = sorted({p.split("/")[1] for p in files if p.count("/") == 2})
            ax.text(0.01, -y - 0.5, when.replace("operation", "op"), fontsize=SMALL, va="center")
            ax.text(0.5, -y - 0.5, f"latest -> {latest!r}; " + ", ".join(d[5:] for d in dirs),
                    fontsize=SMALL, va="center", family="monospace")
        ax.set_xlim(0, 1)
        ax.set_ylim(-len(rows), 0)
        ax.axis("off")
        ax.set_title(title + " (green: a resume can trust the directory)", fontsize=8,
                     loc="left")
    fig.tight_layout()
    return fig


def owners(shape, tp_dim, tp: int, dp: int, zero: bool) -> torch.Tensor:
    """Which rank (tp_rank + tp * dp_rank) holds each element of a tensor of `shape`: the
    TP chunk `placement.local_index` cuts, then, under ZeRO, the `FlatShards` piece of it."""
    index = torch.arange(math.prod(shape)).view(shape)
    owner = torch.empty(math.prod(shape), dtype=torch.long)
    for t in range(tp):
        part = local_index(shape, {"tp": Shard(tp_dim)}, ProcessGrid(tp=tp, rank=t).axes)
        local = index[part].reshape(-1)
        for d in range(dp if zero else 1):
            a, b = FlatShards([local.shape], dp).piece_range(0, d) if zero else (0, len(local))
            owner[local[a:b]] = t + tp * d
    return owner.view(shape)


def plot_resharding(shape=(6, 5), tp_dim=0, save=(2, 2), load=(3, 1)):
    """One weight through a checkpoint: coloured by the rank that saved each element (TP x
    DP with ZeRO, `save` = (tp, dp)), rebuilt whole (`checkpoint.full_tensor`), and cut again
    for the loading layout (`load`, same rule)."""
    fig, axes = plt.subplots(1, 3, figsize=(PAGE_WIDTH, 2.9))
    panels = [(f"saved by tp={save[0]} x dp={save[1]}\n(ZeRO pieces)",
               owners(shape, tp_dim, *save, True)),
              ("rebuilt whole\non load", torch.zeros(shape, dtype=torch.long)),
              (f"cut for\ntp={load[0]} x dp={load[1]}", owners(shape, tp_dim, *load, load[1] > 1))]
    cmap = plt.get_cmap("tab10")
    for ax, (title, owner) in zip(axes, panels):
        colours = [[cmap(int(r) % 10) if "whole" not in title else (0.85, 0.85, 0.85, 1)
                    for r in row] for row in owner]
        ax.imshow(colours, aspect="equal")
        if "whole" not in title:
            for (i, j), r in np.ndenumerate(owner.numpy()):
                ax.text(j, i, str(r), ha="center", va="center", fontsize=SMALL, color="white")
        ax.set_title(title, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"a [{shape[0]}, {shape[1]}] weight split along dim {tp_dim}: the number in "
                 "each element is the rank that holds it", fontsize=8)
    fig.tight_layout()
    return fig
