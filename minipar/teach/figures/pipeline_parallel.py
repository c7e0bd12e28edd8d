"""Figures of the pipeline-parallel chapter: schedules as Gantt charts, and their bubble.

A schedule (simulated by `parallel.schedules.simulate`, or measured: a `--profile` trace's
pipeline actions, `parallel.schedule_analysis.pipeline_events`) drawn one row per pipeline
rank, and the bubble fraction of each schedule as the number of micro-batches grows.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ...formulas.pipeline_parallel import bubble_fraction
from ... import profile
from ...parallel.schedule_analysis import pipeline_events, timeline_from_events
from ...parallel.schedules import Timeline, make_schedule, simulate
from ..style import COLORS, GREY, PAGE_WIDTH, lighter

PASSES = ("F", "B", "W")


def plot_schedule(schedule, t_f: float = 1.0, t_b: float = 2.0, t_w: float = 0.0, ax=None,
                  title=None):
    """A Gantt chart: one row per pipeline rank, one box per timed action, labelled with its
    micro-batch; F, B and W in three colours, later model chunks in lighter shades.

    `schedule`: per-rank action lists (`make_schedule`, timed here by `simulate` with t_f,
    t_b, t_w) or a `Timeline` (simulated, or measured: `timeline_from_events`). Actions of
    zero duration (W when t_w = 0) draw nothing. The title defaults to the bubble fraction.
    """
    tl = schedule if isinstance(schedule, Timeline) else simulate(schedule, t_f, t_b, t_w)
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.5, 0.55 * tl.n_ranks + 1.2))
    n_chunks = 1 + max((e.chunk for e in tl.events), default=0)
    drawn = [e for e in tl.events if e.end > e.start]
    narrow = (tl.makespan or 1) / 70          # a box too narrow for its label stays unlabelled
    for e in drawn:
        shade = 0.55 * e.chunk / max(n_chunks - 1, 1)
        colour = COLORS[e.kind] if e.kind in PASSES else GREY
        ax.add_patch(Rectangle((e.start, e.rank - 0.4), e.end - e.start, 0.8,
                               facecolor=lighter(colour, shade), edgecolor="white", linewidth=0.8))
        if e.end - e.start >= narrow:
            ax.text((e.start + e.end) / 2, e.rank, str(e.microbatch), ha="center", va="center",
                    fontsize=7)
    ax.set_xlim(0, tl.makespan or 1)
    ax.set_ylim(tl.n_ranks - 0.5, -0.5)
    ax.set_yticks(range(tl.n_ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(tl.n_ranks)])
    ax.set_xlabel("time")
    kinds = [k for k in PASSES if any(e.kind == k for e in drawn)]
    ax.legend(handles=[Patch(facecolor=COLORS[k], label=k) for k in kinds],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"bubble {tl.bubble_fraction:.1%}" if title is None else title, fontsize=9)
    return ax


def plot_trace(path, ax=None, title=None):
    """The Gantt chart of a measured run (`python -m minipar.train ... --profile DIR`): the
    pipeline actions of one replica, every step."""
    events = pipeline_events(profile.load(path))
    ax = plot_schedule(timeline_from_events(events), ax=ax, title=title)
    ax.set_xlabel("time (s)")
    return ax


def plot_bubble_vs_microbatches(n_stages: int = 4, microbatches=range(1, 33), n_virtual: int = 2,
                                ax=None):
    """The bubble fraction of each schedule as the number of micro-batches m grows: afab and
    1F1B share (p-1)/(m+p-1), interleaving divides the slot by v, zero-bubble (with forward,
    input-gradient and weight-gradient passes equally long) by 3."""
    ms = list(microbatches)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    curves = [("afab", "-"), ("1f1b", "--"), (f"interleaved (v={n_virtual})", "-"),
              ("zb (ZB-H1)", "-")]
    for label, style in curves:
        name = label.split()[0]
        ax.plot(ms, [bubble_fraction(name, n_stages, m, v=n_virtual) for m in ms], style,
                label=label)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_title(f"p = {n_stages} stages", fontsize=9)
    ax.legend(fontsize=8)
    return ax


def plot_named_schedule(name: str, p: int = 4, m: int = 8, v: int = 1, t_f: float = 1.0,
                        t_b: float = 2.0, t_w: float = 0.0, ax=None, title=None):
    """`plot_schedule` of `make_schedule(name, p, m, v)`, timed by `simulate` (what the
    chapter's pages draw: their figure directive passes only literals)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.5, 0.5 * p + 1.2))
    tl = simulate(make_schedule(name, p, m, v), t_f, t_b, t_w)
    return plot_schedule(tl, ax=ax, title=title or (
        f"{name}, p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "")
        + f": bubble {tl.bubble_fraction:.1%} (simulated)"))
