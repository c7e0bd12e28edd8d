"""The pipeline chapter's explorer (book/pipeline_parallel.md): a schedule's Gantt chart
and bubble as p, m, v and the times of F, B, W and a transfer change.

The schedule is `make_schedule`'s action lists, timed by `simulate` (the functions the
tests check), drawn by `figures.pipeline_parallel.plot_schedule`; the bubble curve is
`formulas.bubble_fraction` at the same times, with the simulated bubble marked on it. The
times default to the chapter's (t_f = t_b = t_w = 1, the zero-bubble paper's): a schedule
without W runs B and W as one backward of t_b + t_w, so "zb" and "1f1b" are compared on
the same work. An invalid combination (interleaved with m not a multiple of p) says the
rule it breaks and the values that fix it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import SCHEDULES, ConfigError, schedule_problems
from ...plan.formulas.pipeline_parallel import bubble_fraction
from ...plan.schedule_analysis import peak_in_flight
from ...plan.schedules import make_schedule, simulate
from ..figures.pipeline_parallel import plot_schedule
from ..style import PAGE_WIDTH
from ..widgets import choice, draw_invalid, explorer, one_change_fixes, steps

DEFAULTS = dict(schedule="1f1b", p=4, m=8, v=2, t_f=1.0, t_b=1.0, t_w=1.0, t_comm=0.0)


def chunks(kw: dict) -> int:
    """v: the model chunks per rank, which only the interleaved schedule has."""
    return kw["v"] if kw["schedule"] == "interleaved" else 1


def same_picture(kw: dict) -> dict:
    """A setting that draws the same picture (teach.web draws it once): v only matters to
    the interleaved schedule, and the times not at all to a schedule that cannot run (its
    picture is the rules it breaks and their fixes)."""
    kw = {**kw, "v": chunks(kw)}
    if problems_of(kw):
        kw.update({name: DEFAULTS[name] for name in ("t_f", "t_b", "t_w", "t_comm")})
    return kw


def problems_of(kw: dict) -> list[str]:
    """The rules of the schedule that `kw` breaks (`config.schedule_problems`)."""
    return schedule_problems(kw["schedule"], kw["p"], kw["m"], chunks(kw))


def figure(**values):
    """Top: the Gantt chart of one step (F blue, B orange, W green; later chunks lighter).
    Below: the bubble fraction of the chosen schedule against m at the chosen times (the
    closed form), and the simulated bubble at the chosen m."""
    kw = {**DEFAULTS, **values}
    v = chunks(kw)
    fig, (gantt, curve) = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 0.55 * kw["p"] + 4.4),
                                       gridspec_kw={"height_ratios": [0.55 * kw["p"] + 1, 2]})
    try:
        schedule = make_schedule(kw["schedule"], kw["p"], kw["m"], v)
    except ConfigError as e:
        curve.axis("off")
        draw_invalid(gantt, e.problems, one_change_fixes(CONTROLS, kw, problems_of))
        return fig
    tl = simulate(schedule, kw["t_f"], kw["t_b"], kw["t_w"], kw["t_comm"])
    plot_schedule(tl, ax=gantt, title=(
        f"{kw['schedule']}, p = {kw['p']}, m = {kw['m']}" + (f", v = {v}" if v > 1 else "")
        + f", F {kw['t_f']:g} B {kw['t_b']:g} W {kw['t_w']:g} transfer {kw['t_comm']:g}: "
        f"bubble {tl.bubble_fraction:.1%},\nrank 0 holds {peak_in_flight(schedule)[0]} "
        f"(micro-batch, chunk) activations"))
    _draw_curve(curve, kw, v, tl.bubble_fraction)
    fig.tight_layout()
    return fig


def _draw_curve(ax, kw: dict, v: int, simulated: float):
    """The closed-form bubble against m at the chosen times; the simulated one at m."""
    times = dict(t_f=kw["t_f"], t_b=kw["t_b"], t_w=kw["t_w"])
    ms = [m for m in range(1, 4 * kw["p"] + 1) if kw["schedule"] != "interleaved" or m % kw["p"] == 0]
    ax.plot(ms, [bubble_fraction(kw["schedule"], kw["p"], m, v, **times) for m in ms], "o-",
            markersize=3, label="closed form")
    ax.plot([kw["m"]], [simulated], "s", color="black", markersize=6, label="simulated")
    ax.axvline(kw["m"], color="grey", linestyle=":")
    ax.set_xlabel("micro-batches m", fontsize=8)
    ax.set_ylabel("bubble fraction", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")


# The notebook's controls and the page's are the same values (the page draws each ahead of
# time): p and m by doubling, each time from the least to the most the notebook offered.
CONTROLS = {"schedule": choice(SCHEDULES), "p": steps([2, 4, 8]), "m": steps([2, 4, 8, 16, 32]),
            "v": steps([1, 2, 4], label="v (interleaved)"), "t_f": steps([0.5, 1.0, 3.0]),
            "t_b": steps([0.5, 1.0, 4.0]), "t_w": steps([0.0, 1.0, 2.0]),
            "t_comm": steps([0.0, 0.5, 1.0])}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every
# combination of the schedule, p and m; v and the four times one at a time.
WEB = {"schedule": list(SCHEDULES), "p": [2, 4, 8], "m": [2, 4, 8, 16, 32]}
ALONE = {name: list(CONTROLS[name].values) for name in ("v", "t_f", "t_b", "t_w", "t_comm")}


def explore(**defaults):
    """Controls for the schedule, p, m, v and the times of F, B, W and a transfer."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=4)
