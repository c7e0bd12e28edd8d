"""Figures of the pipeline-parallel chapter: schedules as Gantt charts, and their bubble.

A schedule (simulated by `parallel.schedules.simulate`, or measured: a `--profile` trace's
pipeline actions, `parallel.schedule_analysis.pipeline_events`) drawn one row per pipeline
rank, and the bubble fraction of each schedule as the number of micro-batches grows.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ...plan import traces
from ...plan.formulas.pipeline_parallel import bubble_fraction
from ...plan.dualpipe import comparison, dualpipev
from ...plan.schedule_analysis import pipeline_events, timeline_from_events
from ...plan.schedules import Timeline, make_schedule, simulate
from .. import replays
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
    events = pipeline_events(traces.load(path))
    ax = plot_schedule(timeline_from_events(events), ax=ax, title=title)
    ax.set_xlabel("time (s)")
    return ax


def plot_bubble_vs_microbatches(pp: int = 4, microbatches=range(1, 33), n_virtual: int = 2,
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
        ax.plot(ms, [bubble_fraction(name, pp, m, v=n_virtual) for m in ms], style,
                label=label)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_title(f"p = {pp} stages", fontsize=9)
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


def plot_dualpipe(p: int = 4, m: int = 8, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0):
    """DualPipeV's timeline on p ranks (the V's way back in lighter shades), and its bubble and
    peak activations beside 1F1B's and ZB-H1's on the same ranks and model
    (`dualpipe.comparison`)."""
    fig = plt.figure(figsize=(PAGE_WIDTH, 0.5 * p + 3.6))
    grid = fig.add_gridspec(2, 2, height_ratios=[0.5 * p + 1.2, 2.2])
    top, left, right = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    tl = simulate(dualpipev(p, m), t_f, t_b, t_w)
    plot_schedule(tl, ax=top, title=f"DualPipeV, p = {p} ranks (2p = {2 * p} stages), m = {m}: "
                  f"bubble {tl.bubble_fraction:.1%} (simulated)")
    rows = comparison(p, m, t_f, t_b, t_w)
    for ax, i, label in ((left, 0, "bubble fraction"), (right, 1, "peak activations (rank-layers)")):
        ax.bar(list(rows), [v[i] for v in rows.values()], color=[GREY, COLORS["W"], COLORS["F"]])
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ at H100 speed
def plot_replayed_schedules():
    """1F1B and interleaved 1F1B (v = 2), p = 4 and m = 8, recorded on four gloo ranks and
    replayed at Llama 3 8B's shapes on H100s: each rank's forwards and backwards as the
    replay timed them (a box per layer), and the bubble the replay measured beside the
    formula's (p-1)/(v m+p-1)."""
    fig, axs = plt.subplots(2, 1, sharex=True, figsize=(PAGE_WIDTH - 0.5, 5.0))
    makespans = []
    for ax, (name, label) in zip(axs, (("pipeline_parallel", "1F1B"),
                                       ("pipeline_parallel_interleaved", "interleaved, v = 2"))):
        run = replays.replayed(name)
        tl = timeline_from_events(pipeline_events(run.trace))
        makespans.append(tl.makespan)
        plot_schedule(tl, ax=ax, title=f"{label}, replayed: bubble {run.bubble_fraction:.0%} "
                                       f"(formula {replays.estimated(name).bubble_fraction:.0%})")
    axs[0].set_xlabel("")
    axs[1].set_xlabel("time (s) on H100s")
    axs[0].set_xlim(0, max(makespans))            # one clock: the shorter step ends earlier
    fig.tight_layout()
    return fig


def _tp0_pipeline(trace: dict) -> dict[int, int]:
    """{pid: pipeline rank} of the ranks at tp = cp = dp = 0: one pipeline of the run."""
    coords = {int(pid): c for pid, c in trace["otherData"]["minipar"]["ranks"].items()}
    return {pid: c["pp"] for pid, c in coords.items()
            if c.get("tp", 0) == c.get("cp", 0) == c.get("dp", 0) == 0}


# what a rank waited on: its DP reduce-scatters, a pipeline neighbour, its TP group, or
# the last ranks (the world's loss all-reduce ends the step)
WAITING = {"dp": (COLORS["dp"], "waiting for DP"), "pp": (COLORS["pp"], "waiting for PP"),
           "tp": ("#333333", "waiting for TP"), "world": ("#CCCCCC", "waiting for the step's end")}


def _waited_axis(events: list[dict]) -> dict[float, str]:
    """{end time: axis} of a rank's communication: a wait ends when what it waited for
    arrives, so the span that ends with it names the axis it waited on."""
    return {round(e["ts"] + e["dur"], 1): e["args"]["axis"] for e in events
            if e["cat"] == "comm"}


def _llama3_bars(trace: dict, rows: dict[int, int]) -> dict[tuple, list]:
    """{(row, colour, height): [(start, width) s]}: one broken bar per row and colour, so
    the figure draws its ~100,000 spans in a few calls."""
    mine = {pid: [] for pid in rows}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] in mine:
            mine[e["pid"]].append(e)
    bars = {}
    for pid, events in mine.items():
        waited = _waited_axis(events)
        for e in events:
            kind = e["args"].get("kind")
            if e["cat"] == "compute":
                key = (COLORS[kind] if kind in PASSES else GREY, 0.7)
            elif e["cat"] == "comm" and e["args"].get("axis") == "pp":
                key = ("black", 0.15)
            elif e["cat"] == "wait":
                axis = waited.get(round(e["ts"] + e["dur"], 1), "world")
                key = (WAITING[axis][0], 0.7)
            else:
                continue
            bars.setdefault((rows[pid], *key), []).append((e["ts"] / 1e6, e["dur"] / 1e6))
    return bars


def plot_llama3_replay(ax=None):
    """Llama 3 405B's step as Table 4's first row runs it (PP16 interleaved, v = 8, 32
    micro-batches, TP8 with SP, DP64): the program recorded on 32 gloo ranks
    and replayed on H100s (`teach.replays`, run "llama3"). One row per pipeline stage of
    TP rank 0: forwards and backwards, a thin line under them for each pipeline transfer,
    and where the rank waited, coloured by the axis it waited on."""
    run = replays.replayed("llama3")
    rows = _tp0_pipeline(run.trace)
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH - 1.9, 4.6))    # the legend takes the rest
    for (y, colour, height), spans in _llama3_bars(run.trace, rows).items():
        offset = 0.45 if height < 0.5 else 0.0          # transfers under the compute row
        ax.broken_barh(spans, (y + offset - height / 2, height), color=colour, linewidth=0)
    n = len(rows)
    ax.set_ylim(n - 0.3, -0.6)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"stage {r}" for r in range(n)], fontsize=7)
    ax.set_xlim(0, run.step_time_s)
    ax.set_xlabel("time (s) on H100s, one step")
    ax.legend(handles=[Patch(color=COLORS["F"], label="F"), Patch(color=COLORS["B"], label="B"),
                       Patch(color=GREY, label="optimizer"), Patch(color="black", label="pp transfer")]
              + [Patch(color=c, label=label) for c, label in WAITING.values()],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"Llama 3 405B, Table 4 row 1, replayed: step {run.step_time_s:.2g} s, "
                 f"bubble {run.bubble_fraction:.0%}, MFU {run.mfu:.0%}", fontsize=9)
    return ax.figure
