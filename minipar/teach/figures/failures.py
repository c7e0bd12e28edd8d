"""Figures of the failures chapter: what interrupts a long run, and what it costs.

Llama 3's interruptions by root cause (checking the published percentages against their
counts), the time lost against the checkpoint interval with each curve's optimum, and loss
curves that show a resumed run continues the one that failed.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ..style import COLORS, FAILURE_CATEGORIES


def plot_interruptions(rows, ax=None):
    """Interruptions per root cause, from (component, category, count, percent) rows: bars
    of the counts coloured by category, each labelled with the printed percentage and the
    percentage its count implies."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 5))
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
    ax.set_xlim(0, max(counts) * 1.9)
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
