"""Figures of the collectives chapter: what a ring sends, and what it costs in time.

The bytes each rank puts on the wire, as CommLog measured them, against the ring formulas;
and the alpha-beta time of an all-reduce against its message size, latency-bound on the
left, bandwidth-bound on the right. The notebook measures; these only draw.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...formulas import all_reduce_time

# Bytes one rank sends, as a fraction of the message S, under the ring algorithm. Written
# out here (not taken from minipar.formulas) so that the figure checks the log, not itself.
RING_FRACTION = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
}
RING_LABEL = {"all_reduce": "all-reduce  2(n-1)/n", "all_gather": "all-gather  (n-1)/n",
              "reduce_scatter": "reduce-scatter  (n-1)/n", "send": "send (p2p)  1"}
# all-gather and reduce-scatter coincide: a hollow ring around a small square
RING_MARKERS = {"all_reduce": dict(marker="o"), "send": dict(marker="^"),
                "all_gather": dict(marker="o", markerfacecolor="none", markersize=11),
                "reduce_scatter": dict(marker="s", markersize=5)}


def plot_ring_bytes(measured: dict, size: int, extra: dict | None = None, ax=None):
    """Measured wire bytes per rank over S (points) against the ring formulas (lines).

    measured: {op: {n: wire_bytes}} for a message of `size` bytes; extra: more point series
    {label: {n: wire_bytes}} drawn on top (e.g. an all-reduce written by hand from sends).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ns = sorted({n for per_n in measured.values() for n in per_n})
    line_n = [x / 10 for x in range(10 * ns[0], 10 * ns[-1] + 1)]
    for op, per_n in measured.items():
        drawn = ax.plot(line_n, [RING_FRACTION[op](n) for n in line_n], "-", linewidth=1,
                        alpha=0.7)
        ax.plot(sorted(per_n), [per_n[n] / size for n in sorted(per_n)], linestyle="none",
                color=drawn[0].get_color(), label=RING_LABEL.get(op, op),
                **RING_MARKERS.get(op, dict(marker="o")))
    for label, per_n in (extra or {}).items():
        ax.plot(sorted(per_n), [per_n[n] / size for n in sorted(per_n)], "x", markersize=10,
                color="black", label=label)
    ax.axhline(2, color="grey", linestyle=":", linewidth=1)
    ax.text(ns[-1], 2, "2S: the limit as n grows", ha="right", va="bottom", fontsize=8,
            color="grey")
    ax.set_xticks(ns)
    ax.set_xlabel("ranks n")
    ax.set_ylabel("bytes sent per rank / S")
    ax.set_ylim(0, 2.2)
    ax.set_title(f"ring algorithms, S = {size / 2**20:g} MiB (points: CommLog, lines: formula)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def plot_all_reduce_time(links: dict, sizes, measured: dict | None = None, ax=None):
    """Model all-reduce time against message size on log axes, one line per link.

    links: {label: (n, alpha_s, bandwidth_bytes_per_s)}; measured: {label: {size: seconds}},
    drawn as points (e.g. gloo on this machine, with its own fitted line in `links`).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    lo, hi = min(sizes), max(sizes)
    steps = 200
    line = [lo * (hi / lo) ** (k / steps) for k in range(steps + 1)]   # even on a log axis
    for label, (n, alpha, bw) in links.items():
        drawn = ax.plot(line, [all_reduce_time(s, n, alpha, bw) for s in line], "-",
                        label=label)
        if measured and label in measured:
            pts = measured[label]
            ax.plot(list(pts), list(pts.values()), "o", color=drawn[0].get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size S (bytes)")
    ax.set_ylabel("all-reduce time (s)")
    ax.set_title("latency-bound on the left, bandwidth-bound on the right", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return ax
