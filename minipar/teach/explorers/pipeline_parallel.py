"""The pipeline chapter's explorer (book/pipeline_parallel.md): a schedule's Gantt chart
and bubble as p, m, v and the schedule change.

The schedule is `make_schedule`'s action lists, timed by `simulate` (the functions the
tests check), drawn by `figures.pipeline_parallel.plot_schedule`; the bubble curve is
`formulas.bubble_fraction`. An invalid combination (interleaved with m not a multiple of
p) draws the rule it breaks.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...config import SCHEDULES, ConfigError
from ...formulas.pipeline_parallel import bubble_fraction
from ...parallel.schedules import make_schedule, peak_in_flight, simulate
from ..figures.pipeline_parallel import plot_schedule
from ..style import INVALID
from ..widgets import live_panel

DEFAULTS = dict(schedule="1f1b", p=4, m=8, v=2, t_f=1.0, t_b=2.0, t_w=0.0, t_comm=0.0)


def figure(**values):
    """Left: the Gantt chart of one step (F blue, B orange, W green; later chunks lighter).
    Right: the bubble fraction of the chosen schedule against m, the chosen m marked."""
    kw = {**DEFAULTS, **values}
    v = kw["v"] if kw["schedule"] == "interleaved" else 1
    fig, (gantt, curve) = plt.subplots(1, 2, figsize=(13, 0.55 * kw["p"] + 2.2),
                                       gridspec_kw={"width_ratios": [3, 1]})
    try:
        schedule = make_schedule(kw["schedule"], kw["p"], kw["m"], v)
    except ConfigError as e:
        gantt.axis("off")
        gantt.text(0, 0.5, f"invalid: {e}", color=INVALID, fontsize=9, wrap=True)
        return fig
    tl = simulate(schedule, kw["t_f"], kw["t_b"], kw["t_w"], kw["t_comm"])
    plot_schedule(tl, ax=gantt, title=(
        f"{kw['schedule']}, p = {kw['p']}, m = {kw['m']}" + (f", v = {v}" if v > 1 else "")
        + f": bubble {tl.bubble_fraction:.1%}, rank 0 holds {peak_in_flight(schedule)[0]} "
        f"(micro-batch, chunk) activations"))
    ms = [m for m in range(1, 4 * kw["p"] + 1) if kw["schedule"] != "interleaved" or m % kw["p"] == 0]
    curve.plot(ms, [bubble_fraction(kw["schedule"], kw["p"], m, v) for m in ms], "o-", markersize=3)
    curve.axvline(kw["m"], color="grey", linestyle=":")
    curve.set_xlabel("micro-batches m", fontsize=8)
    curve.set_ylabel("bubble fraction (formula)", fontsize=8)
    fig.tight_layout()
    return fig


def explore(**defaults):
    """Controls for the schedule, p, m, v and the times of F, B, W and a transfer."""
    import ipywidgets as w   # here, not at the top: only the live explorer needs it

    kw = {**DEFAULTS, **defaults}
    controls = {
        "schedule": w.Dropdown(options=list(SCHEDULES), value=kw["schedule"], description="schedule"),
        "p": w.IntSlider(value=kw["p"], min=1, max=8, description="p"),
        "m": w.IntSlider(value=kw["m"], min=1, max=32, description="m"),
        "v": w.IntSlider(value=kw["v"], min=1, max=4, description="v (interleaved)"),
        "t_f": w.FloatSlider(value=kw["t_f"], min=0.5, max=3, step=0.25, description="t_f"),
        "t_b": w.FloatSlider(value=kw["t_b"], min=0.5, max=4, step=0.25, description="t_b"),
        "t_w": w.FloatSlider(value=kw["t_w"], min=0, max=2, step=0.25, description="t_w"),
        "t_comm": w.FloatSlider(value=kw["t_comm"], min=0, max=1, step=0.05, description="t_comm"),
    }
    return live_panel(controls, lambda values: figure(**values), split=4)
