"""Figures of the cluster chapter: the 4D grid laid onto servers, racks and pods; a
rail-optimized network; and a `--profile` trace drawn the way Perfetto shows it.

The placement pictures are drawn from `ProcessGrid` and the cluster's shape
(`minipar.runtime.topology`: which GPU, server and pod each rank lands on, which link a pair
of ranks crosses), nothing recomputed here.

One band per rank: its computation on top (F, B, W and the optimizer), then a row per axis
on which it communicated, each collective's time split by `traces.hidden_and_exposed` into
hidden (the rank computed meanwhile) and exposed (it waited). The figure reads the same
file the reader opens in ui.perfetto.dev.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ...plan import traces
from ...plan.costmodel.hardware import Cluster
from ...trainer.grid import AXES, ProcessGrid
from ...runtime import topology as place
from ..style import COLORS, GREY, PAGE_WIDTH, RED

HIDDEN, EXPOSED = "#55A868", RED


def step_window(trace: dict, step: int | None = None) -> tuple[int, float, float]:
    """(step, start, end) in microseconds: the span of that step over all ranks (default:
    the last step recorded)."""
    windows = {}
    for e in traces.spans(trace, "step"):
        a, b = windows.get(e["args"]["step"], (float("inf"), float("-inf")))
        windows[e["args"]["step"]] = (min(a, e["ts"]), max(b, e["ts"] + e["dur"]))
    step = max(windows) if step is None else step
    return (step, *windows[step])


def plot_trace_tracks(trace: dict, step: int | None = None, ax=None, title: str | None = None):
    """One step of a trace: per rank a compute row and one row per axis, each collective's
    time green where hidden behind computation and red where exposed. Times in ms from
    the step's start."""
    step, t0, t1 = step_window(trace, step)
    pids = sorted({e["pid"] for e in traces.spans(trace)})
    rows = []                                   # (pid, label, drawer)
    for pid in pids:
        rows.append((pid, "compute", None))
        split = traces.hidden_and_exposed(trace, pid, t0, t1)
        rows += [(pid, axis, split[axis]) for axis in traces.AXES if axis in split]
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.9, 0.32 * len(rows) + 1.2))
    ms = lambda t: (t - t0) / 1e3  # noqa: E731 - microseconds since the step began -> ms
    for y, (pid, label, split) in enumerate(rows):
        if split is None:
            for e in traces.spans(trace, "compute", pid):
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
                                               for e in traces.spans(trace, "compute"))]
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
    row as `traces.exposure` gives it, `steps` the steps it covers (default 1)."""
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


# ------------------------------------------------------------------ the grid on the cluster
AXIS_COLOURS = {"tp": "#4C72B0", "cp": "#8172B2", "pp": "#DD8452", "dp": "#55A868"}


def plot_grid_on_cluster(tp=2, cp=1, pp=4, dp=8, gpus_per_node=8, gpus_per_rack=16,
                         pod_size=32, rank=0, ax=None):
    """Every rank of a [TP, CP, PP, DP] layout on its GPU: a row per server, servers boxed
    by rack and pod. The groups of `rank` are coloured by axis (TP, CP, PP, DP), and the
    title says the slowest link each axis crosses (rail-optimized fabric)."""
    grid = ProcessGrid(tp, cp, pp, dp)
    cluster = Cluster(gpus_per_node=gpus_per_node, gpus_per_rack=gpus_per_rack,
                      pod_size=pod_size)
    servers = -(-grid.world_size // gpus_per_node)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.6 * gpus_per_node + 1.2, 0.42 * servers + 1.7))
    colour = {}
    for axis in AXES:
        for r in grid.group_ranks(axis, rank) if grid.sizes[axis] > 1 else ():
            colour.setdefault(r, AXIS_COLOURS[axis]) if r != rank else None
    for r in range(grid.world_size):
        x, y = r % gpus_per_node, r // gpus_per_node
        c = grid.coords(r)
        face = "black" if r == rank else colour.get(r, "#EEEEEE")
        ax.add_patch(Rectangle((x + 0.06, -y - 0.94), 0.88, 0.88, color=face))
        ink = "white" if r in colour or r == rank else "black"
        ax.text(x + 0.5, -y - 0.38, str(r), ha="center", va="center", fontsize=8, color=ink,
                weight="bold")
        ax.text(x + 0.5, -y - 0.72, " ".join(f"{c[a]}" for a in AXES), ha="center",
                va="center", fontsize=7, color=ink)
    _boxes(ax, servers, gpus_per_node, gpus_per_rack // gpus_per_node, "rack", 0.0, "grey")
    _boxes(ax, servers, gpus_per_node, pod_size // gpus_per_node, "pod", 0.25, "black")
    links = {a: place.slowest_link(grid, a, cluster) for a in AXES if grid.sizes[a] > 1}
    ax.set_xlim(-0.9, gpus_per_node + 1.6)
    ax.set_ylim(-servers - 0.3, 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.legend(handles=[Patch(color="black", label=f"rank {rank}")] + [
        Patch(color=AXIS_COLOURS[a], label=f"its {a.upper()} group: {links[a]}")
        for a in AXES if a in links], fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0),
        ncol=2, frameon=False)
    ax.set_title(f"tp={tp} cp={cp} pp={pp} dp={dp} on servers of {gpus_per_node} GPUs "
                 f"(a row each), racks of {gpus_per_rack}, pods of {pod_size}\n"
                 "each square: rank, then its (tp cp pp dp) coordinates", fontsize=8)
    return ax.figure


def _boxes(ax, servers, width, per_box, label, pad, colour):
    """Outline consecutive blocks of `per_box` servers (racks or pods) and name them."""
    for k in range(-(-servers // per_box)):
        top, rows = k * per_box, min(per_box, servers - k * per_box)
        ax.add_patch(Rectangle((-pad, -top - rows - pad / 2), width + 2 * pad, rows + pad,
                               fill=False, edgecolor=colour, linewidth=0.8 + 2 * pad,
                               linestyle="-" if label == "pod" else ":"))
        x = width + 0.4 if label == "rack" else -pad - 0.1      # racks: right of the pod box
        ax.text(x, -top - 0.5, f"{label} {k}", fontsize=7, color=colour, va="center",
                ha="left" if label == "rack" else "right", rotation=0 if label == "rack" else 90)


def plot_rail_topology(tp=8, pp=2, dp=1, gpus_per_node=8):
    """A rail-optimized network for a small layout: GPU i of every server on leaf switch i
    (rail i), the leaves joined by a spine. The pipeline sends of the layout are drawn: a
    send between servers whose GPUs sit on one rail crosses one leaf (green); between rails
    it climbs to the spine (red). TP stays on the server's NVLink."""
    grid = ProcessGrid(tp=tp, pp=pp, dp=dp)
    servers = -(-grid.world_size // gpus_per_node)
    cluster = Cluster(gpus_per_node=gpus_per_node, pod_size=10 ** 9)
    fig, ax = plt.subplots(figsize=(1.6 * servers + 2.5, 4.6))
    gx = lambda r: (r // gpus_per_node) * 1.6 + 0.2 * (r % gpus_per_node)  # noqa: E731
    leaf_x = [servers * 1.6 / gpus_per_node * i + 0.1 for i in range(gpus_per_node)]
    for s in range(servers):
        ax.add_patch(Rectangle((s * 1.6 - 0.12, -0.25), 0.2 * gpus_per_node + 0.04, 0.5,
                               fill=False, edgecolor="grey"))
        ax.text(s * 1.6 + 0.1 * gpus_per_node - 0.1, -0.45, f"server {s} (NVLink inside)",
                ha="center", fontsize=7)
    for r in range(servers * gpus_per_node):
        i = r % gpus_per_node
        ax.plot([gx(r), leaf_x[i]], [0.15, 2.0], color="#DDDDDD", linewidth=0.6, zorder=1)
        ax.add_patch(Rectangle((gx(r) - 0.08, -0.15), 0.16, 0.3, color="#4C72B0", zorder=2))
        ax.text(gx(r), 0, str(r), ha="center", va="center", fontsize=6, color="white", zorder=3)
    for i, x in enumerate(leaf_x):
        ax.add_patch(Rectangle((x - 0.25, 2.0), 0.5, 0.3, color="#999999"))
        ax.text(x, 2.15, f"rail {i}", ha="center", va="center", fontsize=6.5, color="white")
        ax.plot([x, servers * 0.8], [2.3, 3.4], color="#DDDDDD", linewidth=0.6)
    ax.add_patch(Rectangle((servers * 0.8 - 0.6, 3.4), 1.2, 0.3, color="#555555"))
    ax.text(servers * 0.8, 3.55, "spine", ha="center", va="center", fontsize=7, color="white")
    counts = _draw_sends(ax, grid, cluster, gx, leaf_x, servers)
    ax.set_xlim(-0.4, max(servers * 1.6, leaf_x[-1] + 0.4))
    ax.set_ylim(-0.7, 3.9)
    ax.axis("off")
    ax.set_title(f"tp={tp} pp={pp} dp={dp}: pipeline sends between servers,\n"
                 f"{counts['rail']} on one rail (green), {counts['spine']} via the spine "
                 f"(red), {counts['NVLink']} inside a server", fontsize=8)
    return fig


def _draw_sends(ax, grid, cluster, gx, leaf_x, servers):
    """Draw each stage-to-next-stage send of the layout by the link it takes."""
    counts = {"NVLink": 0, "rail": 0, "spine": 0, "across pods": 0}
    for g in place.groups(grid, "pp"):
        for a, b in zip(g, g[1:]):
            kind = place.link(a, b, cluster)
            counts[kind] += 1
            if kind == "NVLink":
                continue
            n = cluster.gpus_per_node
            colour = "#55A868" if kind == "rail" else RED
            top = 2.0 if kind == "rail" else 3.4
            xs = [gx(a), leaf_x[a % n]] + ([servers * 0.8, leaf_x[b % n]] if kind == "spine" else []) + [gx(b)]
            ys = [0.15, 2.0] + ([top, 2.0] if kind == "spine" else []) + [0.15]
            ax.plot(xs, ys, color=colour, linewidth=1.4, alpha=0.8, zorder=4)
    return counts
