"""Figures of the collectives chapter: what a ring sends, and what it costs in time.

The bytes each rank puts on the wire, as CommLog measured them, against the ring formulas;
and the alpha-beta time of an all-reduce against its message size, latency-bound on the
left, bandwidth-bound on the right. The notebook measures; these only draw.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ...plan.formulas.collective_time import (ALL_REDUCE_ALGORITHMS, all_reduce_cost,
                                              all_reduce_time)
from ...trainer.ring import ring_schedule
from ..style import PAGE_WIDTH, SMALL

# Bytes one rank sends, as a fraction of the message S, under the ring algorithm. Written
# out here (not taken from minipar.plan.formulas) so that the figure checks the log, not itself.
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


def ring_states(n: int) -> list[tuple[str, list[int] | None, list[list[frozenset]]]]:
    """The ring all-reduce of `ring.ring_schedule(n)`, played step by step: (title, the
    chunk each rank sends at this step or None, held[r][c] = the ranks whose contribution
    rank r's copy of chunk c holds after it). Pure."""
    rs, ag = ring_schedule(n)
    held = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    states = [("start: rank r holds its own x_r", None, held)]
    for phase, schedule in (("reduce-scatter", rs), ("all-gather", ag)):
        for k, sends in enumerate(schedule):
            new = [row[:] for row in held]
            for r in range(n):                      # r sends chunk sends[r] to r + 1
                c, right = sends[r], (r + 1) % n
                new[right][c] = held[right][c] | held[r][c] if phase == "reduce-scatter" \
                    else held[r][c]
            held = new
            states.append((f"{phase} step {k + 1}", sends, held))
    return states


def plot_ring_steps(n: int = 4):
    """One panel per step of a ring all-reduce over n ranks: rows are ranks, columns are the
    n chunks of the tensor, each cell shaded by how many ranks' contributions that copy
    holds (its number); a black frame marks the chunk a rank sends to its right neighbour
    at that step. After n-1 reduce-scatter steps rank r's chunk r is complete; after n-1
    all-gather steps every chunk is, on every rank."""
    states = ring_states(n)
    cols = n
    rows = -(-len(states) // cols)
    side = PAGE_WIDTH / cols
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_WIDTH, side * rows), squeeze=False)
    cmap = plt.get_cmap("Blues")
    for a, (title, sends, held) in zip(axes.flat, states):
        for r in range(n):
            for c in range(n):
                k = len(held[r][c])
                a.add_patch(Rectangle((c, r), 1, 1, facecolor=cmap(0.15 + 0.75 * k / n),
                                      edgecolor="white"))
                a.text(c + 0.5, r + 0.5, str(k), ha="center", va="center", fontsize=8,
                       color="white" if k > n / 2 else "black")
            if sends is not None:
                a.add_patch(Rectangle((sends[r], r), 1, 1, fill=False, edgecolor="black",
                                      linewidth=2))
        a.set_xlim(0, n)
        a.set_ylim(n, 0)
        a.set_xticks([c + 0.5 for c in range(n)], [str(c) for c in range(n)], fontsize=SMALL)
        a.set_yticks([r + 0.5 for r in range(n)], [f"rank {r}" if a in axes[:, 0] else ""
                                                    for r in range(n)], fontsize=SMALL)
        a.set_title(title.replace(" step", "\nstep").replace("start: ", "start:\n"),
                    fontsize=8)
        a.set_aspect("equal")
    for a in list(axes.flat)[len(states):]:
        a.axis("off")
    fig.supxlabel("chunk (S/n bytes each); number: contributions summed in this copy",
                  fontsize=8)
    fig.tight_layout()
    return fig


def plot_algorithms(n: int, size: float, alpha: float, bandwidth: float,
                    algorithms=ALL_REDUCE_ALGORITHMS, ax=None):
    """Bytes the busiest rank sends (over S) and the modelled time of an all-reduce of
    `size` bytes over n ranks, one bar per algorithm of `formulas.all_reduce_cost`."""
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.2))
    costs = {a: all_reduce_cost(a, n, size, alpha, bandwidth) for a in algorithms}
    x = range(len(costs))
    ax[0].bar(x, [b / size for b, _ in costs.values()], color="#4C72B0")
    ax[1].bar(x, [t * 1e3 for _, t in costs.values()], color="#DD8452")
    for a, unit in ((ax[0], "bytes sent by the busiest rank / S"), (ax[1], "time (ms), modelled")):
        a.set_xticks(list(x), list(costs), fontsize=8)
        a.set_ylabel(unit, fontsize=8)
    for i, (b, t) in enumerate(costs.values()):
        ax[0].text(i, b / size, f"{b / size:.3g}", ha="center", va="bottom", fontsize=8)
        ax[1].text(i, t * 1e3, f"{t * 1e3:.3g}", ha="center", va="bottom", fontsize=8)
    ax[0].set_yscale("log")
    ax[1].set_yscale("log")
    return ax


def collective_states(op: str, n: int) -> tuple[list[list], list[list]]:
    """(before, after) of collective `op` over n ranks, each as cells[r] = rank r's list of
    chunks, a chunk being the frozenset of (rank, chunk) contributions it holds (None: the
    rank holds nothing there). The definitions of the chapter's table, played on labels."""
    own = [[frozenset([(r, c)]) for c in range(n)] for r in range(n)]
    summed = [frozenset((q, c) for q in range(n)) for c in range(n)]
    if op == "all_reduce":
        return own, [list(summed) for _ in range(n)]
    if op == "reduce_scatter":
        return own, [[summed[c] if c == r else None for c in range(n)] for r in range(n)]
    if op == "all_gather":
        mine = [[own[r][c] if c == r else None for c in range(n)] for r in range(n)]
        return mine, [[own[c][c] for c in range(n)] for _ in range(n)]
    if op == "all_to_all":
        return own, [[own[q][r] for q in range(n)] for r in range(n)]
    raise ValueError(f"unknown collective {op!r}")


def plot_collectives(n: int = 4, ops=("all_reduce", "reduce_scatter", "all_gather", "all_to_all")):
    """Before and after of each collective over n ranks (rows): a chunk coloured by the rank
    its data came from, labelled "r.c" (rank r's chunk c); a summed chunk is grey and
    labelled with a sum sign; a blank cell is not held. Two collectives per row of panels."""
    colors = plt.get_cmap("tab10")
    rows = -(-len(ops) // 2)
    fig, axes = plt.subplots(rows, 4, figsize=(PAGE_WIDTH, rows * (PAGE_WIDTH / 4 + 0.3)),
                             squeeze=False, gridspec_kw={"wspace": 0.12, "hspace": 0.45})
    for k, op in enumerate(ops):
        for j, (cells, when) in enumerate(zip(collective_states(op, n), ("before", "after"))):
            a = axes[k // 2, 2 * (k % 2) + j]
            for r, row in enumerate(cells):
                for c, chunk in enumerate(row):
                    _draw_chunk(a, r, c, chunk, colors)
            a.set_xlim(0, n)
            a.set_ylim(n, 0)
            a.set_xticks([])
            a.set_yticks([r + 0.5 for r in range(n)],
                         [f"rank {r}" for r in range(n)] if k % 2 == j == 0 else [],
                         fontsize=SMALL)
            a.set_title(f"{op.replace('_', '-')}: {when}" if j == 0 else f"{when}", fontsize=8,
                        loc="left" if j == 0 else "center")
            a.set_aspect("equal")
    for a in axes.flat[len(ops) * 2:]:
        a.axis("off")
    return fig


def _draw_chunk(a, r: int, c: int, chunk, colors):
    """One cell of `plot_collectives`."""
    if chunk is None:
        a.add_patch(Rectangle((c, r), 1, 1, facecolor="white", edgecolor="#DDDDDD"))
        return
    (q, i), = chunk if len(chunk) == 1 else [(None, None)]
    face = colors(q) if q is not None else "#BBBBBB"
    label = f"{q}.{i}" if q is not None else "Σ." + str(next(iter(chunk))[1])
    a.add_patch(Rectangle((c, r), 1, 1, facecolor=face, edgecolor="white", alpha=0.85))
    a.text(c + 0.5, r + 0.5, label, ha="center", va="center", fontsize=SMALL)
