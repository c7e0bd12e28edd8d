"""The pipeline chapter's explorer (book/pipeline_parallel.md): a schedule's Gantt chart
and bubble as p, m, v and the schedule change.

The schedule is `make_schedule`'s action lists, timed by `simulate` (the functions the
tests check), drawn by `figures.pipeline_parallel.plot_schedule`; the bubble curve is
`formulas.bubble_fraction`. An invalid combination (interleaved with m not a multiple of
p) draws the rule it breaks.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import SCHEDULES, ConfigError
from ...plan.formulas.pipeline_parallel import bubble_fraction
from ...plan.schedule_analysis import peak_in_flight
from ...plan.schedules import make_schedule, simulate
from ..figures.pipeline_parallel import plot_schedule
from ..style import INVALID, PAGE_WIDTH
from ..widgets import choice, explorer, slider

DEFAULTS = dict(schedule="1f1b", p=4, m=8, v=2, t_f=1.0, t_b=2.0, t_w=0.0, t_comm=0.0)


def figure(**values):
    """Top: the Gantt chart of one step (F blue, B orange, W green; later chunks lighter).
    Below: the bubble fraction of the chosen schedule against m, the chosen m marked."""
    kw = {**DEFAULTS, **values}
    v = kw["v"] if kw["schedule"] == "interleaved" else 1
    fig, (gantt, curve) = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 0.55 * kw["p"] + 4.4),
                                       gridspec_kw={"height_ratios": [0.55 * kw["p"] + 1, 2]})
    try:
        schedule = make_schedule(kw["schedule"], kw["p"], kw["m"], v)
    except ConfigError as e:
        gantt.axis("off")
        gantt.text(0, 0.5, f"invalid: {e}", color=INVALID, fontsize=9, wrap=True)
        return fig
    tl = simulate(schedule, kw["t_f"], kw["t_b"], kw["t_w"], kw["t_comm"])
    plot_schedule(tl, ax=gantt, title=(
        f"{kw['schedule']}, p = {kw['p']}, m = {kw['m']}" + (f", v = {v}" if v > 1 else "")
        + f": bubble {tl.bubble_fraction:.1%},\nrank 0 holds {peak_in_flight(schedule)[0]} "
        f"(micro-batch, chunk) activations"))
    ms = [m for m in range(1, 4 * kw["p"] + 1) if kw["schedule"] != "interleaved" or m % kw["p"] == 0]
    curve.plot(ms, [bubble_fraction(kw["schedule"], kw["p"], m, v) for m in ms], "o-", markersize=3)
    curve.axvline(kw["m"], color="grey", linestyle=":")
    curve.set_xlabel("micro-batches m", fontsize=8)
    curve.set_ylabel("bubble fraction (formula)", fontsize=8)
    fig.tight_layout()
    return fig


CONTROLS = {"schedule": choice(SCHEDULES), "p": slider(1, 8), "m": slider(1, 32),
            "v": slider(1, 4, label="v (interleaved)"), "t_f": slider(0.5, 3.0, 0.25),
            "t_b": slider(0.5, 4.0, 0.25), "t_w": slider(0.0, 2.0, 0.25),
            "t_comm": slider(0.0, 1.0, 0.05)}


# The settings the HTML book offers (teach/web.py draws each combination when the book is
# built); the other controls stay at DEFAULTS.
WEB = {"schedule": list(SCHEDULES), "p": [2, 4, 8], "m": [4, 8, 16]}


def explore(**defaults):
    """Controls for the schedule, p, m, v and the times of F, B, W and a transfer."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=4)
