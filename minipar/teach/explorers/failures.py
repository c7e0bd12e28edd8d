"""The failures chapter's explorer: checkpoint interval, MTBF, write and restart time ->
the fraction of time lost (`minipar.runtime.checkpoint.expected_waste`) and where it goes."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ...plan.formulas.failures import daly_interval, expected_waste, young_interval
from ..numbers import failures as facts
from ..style import COLORS, PAGE_WIDTH
from ..widgets import explorer, log_slider, slider

DEFAULTS = dict(interval_min=10.0, mtbf_h=round(facts.mtbf_s() / 3600, 2),
                write_s=round(facts.checkpoint_bytes() / (facts.TECTONIC_TBps * 1e12), 1),
                restart_s=300.0)


def parts(interval_s: float, write_s: float, mtbf_s: float, restart_s: float) -> dict:
    """The three terms of `expected_waste`: writing, redoing half an interval, restarting."""
    return {"writing": write_s / interval_s, "redoing": (interval_s + write_s) / 2 / mtbf_s,
            "restarting": restart_s / mtbf_s}


def figure(interval_min=DEFAULTS["interval_min"], mtbf_h=DEFAULTS["mtbf_h"],
           write_s=DEFAULTS["write_s"], restart_s=DEFAULTS["restart_s"]):
    """Left: time lost against the interval, the chosen interval and Young's and Daly's
    optima marked. Right: the chosen interval's loss by term."""
    m, tau = mtbf_h * 3600, interval_min * 60
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.6),
                                 gridspec_kw={"width_ratios": [2.2, 1]})
    xs = np.geomspace(max(write_s, 5.0), 20 * m, 300)
    total = [100 * expected_waste(t, write_s, m, restart_s) for t in xs]
    ax.plot(xs / 60, total, color="black", label="time lost")
    for name, colour in (("writing", COLORS.get("dp", "tab:blue")), ("redoing", "tab:orange")):
        ax.plot(xs / 60, [100 * parts(t, write_s, m, restart_s)[name] for t in xs], "--",
                color=colour, linewidth=1, label=name)
    young, daly = young_interval(write_s, m), daly_interval(write_s, m)
    for t, style, label in ((young, "o", "Young"), (daly, "s", "Daly")):
        ax.plot([t / 60], [100 * expected_waste(t, write_s, m, restart_s)], style, color="grey",
                label=f"{label}: {t / 60:.1f} min")
    here = 100 * expected_waste(tau, write_s, m, restart_s)
    ax.plot([interval_min], [here], "*", color="red", markersize=12,
            label=f"yours: {interval_min:g} min, {here:.1f}% lost")
    ax.set(xscale="log", ylim=(0, min(100, 3 * max(here, min(total)) + 5)),
           xlabel="checkpoint interval (minutes)", ylabel="time lost (%)")
    ax.legend(fontsize=7)
    split = parts(tau, write_s, m, restart_s)
    bx.bar(list(split), [100 * v for v in split.values()],
           color=[COLORS.get("dp", "tab:blue"), "tab:orange", "tab:grey"])
    bx.set(ylabel="% of the time", title=f"at {interval_min:g} min", xlabel="")
    fig.suptitle(f"MTBF {mtbf_h:g} h, a write takes {write_s:g} s, a restart {restart_s:g} s\n"
                 "(first order, minipar.plan.formulas.failures.expected_waste)", fontsize=9)
    fig.tight_layout()
    return fig


CONTROLS = {"interval_min": log_slider(-0.5, 3, "interval (min)"),
            "mtbf_h": log_slider(-1, 2, "MTBF (h)"), "write_s": log_slider(-1, 3, "write (s)"),
            "restart_s": slider(0.0, 1800.0, 30.0, "restart (s)")}


# The settings the HTML book offers (teach/web.py draws each ahead of time): each slider's
# ends, its default and values between; every interval, each with the MTBF, the write and
# the restart moved one at a time.
WEB = {"interval_min": sorted({10 ** -0.5, 1.0, 3.0, DEFAULTS["interval_min"], 100.0, 1000.0})}
ALONE = {"mtbf_h": sorted({0.1, 1.0, DEFAULTS["mtbf_h"], 10.0, 100.0}),
         "write_s": sorted({0.1, 1.0, DEFAULTS["write_s"], 10.0, 100.0, 1000.0}),
         "restart_s": sorted({0.0, DEFAULTS["restart_s"], 600.0, 1200.0, 1800.0})}


def explore(**defaults):
    """Sliders over `figure`."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=2)
