"""Figures of the cluster chapter: a `--profile` trace drawn the way Perfetto shows it.

One band per rank: its computation on top (F, B, W and the optimizer), then a row per axis
on which it communicated, each collective's time split by `profile.hidden_and_exposed` into
hidden (the rank computed meanwhile) and exposed (it waited). The figure reads the same
file the reader opens in ui.perfetto.dev.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ... import profile
from ..style import COLORS, GREY, RED

HIDDEN, EXPOSED = "#55A868", RED


def step_window(trace: dict, step: int | None = None) -> tuple[int, float, float]:
    """(step, start, end) in microseconds: the span of that step over all ranks (default:
    the last step recorded)."""
    windows = {}
    for e in profile.spans(trace, "step"):
        a, b = windows.get(e["args"]["step"], (float("inf"), float("-inf")))
        windows[e["args"]["step"]] = (min(a, e["ts"]), max(b, e["ts"] + e["dur"]))
    step = max(windows) if step is None else step
    return (step, *windows[step])


def plot_trace_tracks(trace: dict, step: int | None = None, ax=None, title: str | None = None):
    """One step of a trace: per rank a compute row and one row per axis, each collective's
    time green where hidden behind computation and red where exposed. Times in ms from
    the step's start."""
    step, t0, t1 = step_window(trace, step)
    pids = sorted({e["pid"] for e in profile.spans(trace)})
    rows = []                                   # (pid, label, drawer)
    for pid in pids:
        rows.append((pid, "compute", None))
        split = profile.hidden_and_exposed(trace, pid, t0, t1)
        rows += [(pid, axis, split[axis]) for axis in profile.AXES if axis in split]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.2))
    ms = lambda t: (t - t0) / 1e3  # noqa: E731 - microseconds since the step began -> ms
    for y, (pid, label, split) in enumerate(rows):
        if split is None:
            for e in profile.spans(trace, "compute", pid):
                if t0 <= e["ts"] <= t1:
                    ax.barh(y, e["dur"] / 1e3, left=ms(e["ts"]), height=0.8,
                            color=COLORS[e["args"]["kind"]] if e["args"].get("kind") in
                            ("F", "B", "W") else GREY, edgecolor="white",
                            linewidth=0.3)
            continue
        for intervals, colour in zip(split, (HIDDEN, EXPOSED)):
            for a, b in intervals:
                ax.barh(y, (b - a) / 1e3, left=ms(a), height=0.6, color=colour)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {pid} {label}" if label == "compute" else label
                        for pid, label, _ in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel(f"time since step {step} began (ms)")
    kinds = [k for k in ("F", "B", "W") if any(e["args"].get("kind") == k
                                               for e in profile.spans(trace, "compute"))]
    handles = [Patch(color=COLORS[k], label=k) for k in kinds] + [
        Patch(color=GREY, label="optimizer"), Patch(color=HIDDEN, label="comm, hidden"),
        Patch(color=EXPOSED, label="comm, exposed")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_exposure(runs: dict, ax=None, title: str | None = None):
    """Stacked bars, one per run: the communication time of the axis each run is about,
    hidden (green) and exposed (red), per rank and step in ms. runs: {label: (axis, row)},
    row as `profile.exposure` gives it, `steps` the steps it covers (default 1)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.45 * len(runs) + 1.2))
    labels = list(runs)
    for y, label in enumerate(labels):
        axis, row = runs[label]
        per_step = 1e3 / row.get("steps", 1)
        hidden, exposed = row["hidden"] * per_step, row["exposed"] * per_step
        ax.barh(y, hidden, color=HIDDEN, label="hidden" if y == 0 else None)
        ax.barh(y, exposed, left=hidden, color=EXPOSED, label="exposed" if y == 0 else None)
        share = hidden / (hidden + exposed) if hidden + exposed else 0.0
        ax.text(hidden + exposed, y, f" {share:.0%} hidden", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels([f"{label} ({runs[label][0]})" for label in labels], fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("communication per rank and step (ms; gloo on shared CPU cores)")
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    return ax
