"""Figures of the 4D chapter: which ranks share a group along each axis, the threshold
plots of choosing a layout, and the cost model against the published runs.

The rank grid: one panel per axis over the same arrangement of ranks, a colour per group,
read from the grid's own `coords` and `all_groups`. The thresholds: one rule each, drawn
from the numbers of `minipar.plan.costmodel.rules` and the planner: nothing recomputed here.
"""
from __future__ import annotations


import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullLocator

from ...plan.config import ModelConfig
from ...plan.costmodel import LLAMA3_CLUSTER, rules
from ...plan.formulas.pipeline_parallel import bubble_fraction
from ...trainer.grid import AXES, ProcessGrid
from .. import replays
from ..numbers.fourd import (DP_FRAMEWORKS, DP_RULE_BATCH, WORKED, dp_rule_share,
                             worked_cluster, worked_plan)
from ..style import AXIS_NAMES, COLORS, PAGE_WIDTH


def describe_grid(grid: ProcessGrid) -> str:
    """Which ranks share each group, as a table a reader can check against the figure."""
    dims = " ".join(f"{a}={grid.sizes[a]}" for a in AXES)
    lines = [f"world of {grid.world_size} ranks: {dims} (order [TP, CP, PP, DP], TP innermost)"]
    for name in (*AXES, "dp_cp"):
        groups = grid.all_groups(name)
        shown = " ".join("[" + ",".join(map(str, g)) + "]" for g in groups[:8])
        more = f" ... ({len(groups)} groups)" if len(groups) > 8 else ""
        lines.append(f"  {name:5s} groups of {len(groups[0])}: {shown}{more}")
    return "\n".join(lines)


def plot_rank_grid(tp: int = 2, cp: int = 2, pp: int = 2, dp: int = 2):
    """Which ranks share each group: one panel per axis, the same arrangement of ranks in
    each (a column per (cp, tp) pair, a row per (dp, pp) pair), ranks of one group in one
    colour. The arrangement is the grid's own `coords`, nothing recomputed here."""
    grid = ProcessGrid(tp, cp, pp, dp)
    fig, axes = plt.subplots(1, 4, figsize=(PAGE_WIDTH, 2.5))
    for ax, axis in zip(axes, AXES):
        _draw_groups(ax, grid, axis)
    fig.suptitle(f"{grid.world_size} ranks, tp={tp} cp={cp} pp={pp} dp={dp}: "
                 "columns (cp, tp), rows (dp, pp); one colour per group", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig


def _draw_groups(ax, grid: ProcessGrid, axis: str):
    """One panel of `plot_rank_grid`: every rank a square, coloured by its `axis` group."""
    palette = plt.get_cmap("tab20").colors
    groups = grid.all_groups(axis)
    colour_of = {r: palette[i % len(palette)] for i, g in enumerate(groups) for r in g}
    tp, cp, pp, dp = (grid.sizes[a] for a in AXES)
    for r in range(grid.world_size):
        c = grid.coords(r)
        x, y = c["tp"] + tp * c["cp"], c["pp"] + pp * c["dp"]
        ax.add_patch(Rectangle((x + 0.05, -y - 0.95), 0.9, 0.9, color=colour_of[r], alpha=0.85))
        ax.text(x + 0.5, -y - 0.5, str(r), ha="center", va="center", fontsize=9, color="white",
                weight="bold")
    ax.set_xlim(0, tp * cp)
    ax.set_ylim(-pp * dp, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{AXIS_NAMES[axis]}\n{len(groups)} groups of {len(groups[0])}", fontsize=8)


# ------------------------------------------------------------------ choosing a layout
# Each threshold plot draws one rule of `minipar.plan.costmodel.rules` against the variable that
# moves it; the numbers are the cost model's, nothing is recomputed here.
def plot_tp_threshold(widths, ratios: dict, overlapped: dict | None = None, budget: float = 0.2):
    """TP's exposed communication over its matmuls against model width, a line per degree t
    (`ratios[t]`: one value per width; `overlapped[t]` the same with --tp-overlap, dashed).
    Below `budget` TP is cheap; the lines cross it where the width is enough for that t."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.6, 3.6))
    for t, ys in ratios.items():
        line, = ax.plot(widths, ys, "o-", label=f"TP{t}")
        if overlapped:
            ax.plot(widths, overlapped[t], "--", color=line.get_color(), alpha=0.7)
    ax.text(widths[0], budget * 1.15, f"budget {budget:g}", fontsize=8)
    ax.set_yscale("log")
    return _threshold(fig, ax, widths, budget, "model width h", "exposed TP / matmul time",
                      "TP: communication over compute falls as 1/h, rises with t"
                      + (" (dashed: --tp-overlap)" if overlapped else ""))


def plot_bubble_threshold(microbatches, bubbles: dict, budget: float = 0.1):
    """The bubble against micro-batches per DP rank, a line per (pp, v) (`bubbles[label]`)."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.6, 3.6))
    for label, ys in bubbles.items():
        ax.plot(microbatches, ys, "o-", label=label)
    return _threshold(fig, ax, microbatches, budget, "micro-batches per DP rank m",
                      "bubble fraction", "PP: the bubble (p-1)/(vm+p-1) needs m >> p/v")


def plot_dp_threshold(tokens_per_rank, shares: dict, budget: float = 0.05):
    """Exposed DP time's share of the step against tokens per DP rank, a line per model."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.6, 3.6))
    for label, ys in shares.items():
        ax.plot(tokens_per_rank, ys, "o-", label=label)
    return _threshold(fig, ax, None, budget, "tokens per DP rank per step", "exposed DP / step",
                      "DP: exposure grows as each rank's share of the batch shrinks")


def _threshold(fig, ax, ticks, budget: float, xlabel: str, ylabel: str, title: str):
    """What every threshold plot shares: the budget line, a log x axis (labelled at `ticks`
    when given), the legend."""
    ax.axhline(budget, color="k", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=9)
    if ticks is not None:
        _log_ticks(ax, ticks, [str(x) for x in ticks])
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_cp_threshold(seq_lens, attention: list, cp_ratios: dict):
    """Left: attention's share of a block's compute against s. Right: CP's unhidden
    communication over attention, a line per (cp, implementation)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.2))
    a.plot(seq_lens, attention, "o-", color="k")
    a.axhline(0.5, color="k", lw=0.8, ls=":")
    a.set(xscale="log", xlabel="sequence length s", ylabel="attention / block compute")
    a.set_title("attention grows as s;\nthe matmuls do not", fontsize=9)
    for label, ys in cp_ratios.items():
        b.plot(seq_lens, ys, "o-", label=label)
    b.set(xscale="log", yscale="symlog", xlabel="sequence length s",
          ylabel="exposed CP / attention time")
    b.set_title("CP: bytes grow as s,\nattention as s^2", fontsize=9)
    b.legend(fontsize=8)
    for ax in (a, b):
        _log_ticks(ax, seq_lens, [f"{s // 1024}K" for s in seq_lens])
    fig.tight_layout()
    return fig


def _log_ticks(ax, values, labels):
    """Ticks at `values` only, on a log axis (no minor labels crowding them)."""
    ax.set_xticks(values, labels)
    ax.xaxis.set_minor_locator(NullLocator())


# where a planned step's time goes, each part in the book's colour for it
PLAN_PARTS = {"compute": COLORS["compute"], "tp": COLORS["tp time"], "cp": COLORS["cp"],
              "bubble": COLORS["bubble"], "pp": COLORS["pp"], "dp": COLORS["dp"],
              "optimizer": COLORS["reference"]}


def plot_plan(labels, breakdowns: list[dict], mfus: list[float]):
    """Where the step of each planned layout goes (stacked shares of the step), with its MFU:
    one bar per layout, its name and MFU written above it."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 1.0 + 0.5 * len(labels)))
    left = [0.0] * len(labels)
    for k, colour in PLAN_PARTS.items():
        widths = [b.get(k, 0.0) / sum(b.values()) for b in breakdowns]
        ax.barh(range(len(labels)), widths, left=left, height=0.45, label=k, color=colour)
        left = [x + w for x, w in zip(left, widths)]
    for y, (lab, m) in enumerate(zip(labels, mfus)):
        ax.text(0, y - 0.27, f"{lab}   (MFU {100 * m:.1f}%)", fontsize=7.5, va="bottom")
    ax.set_yticks([])
    ax.set_ylim(len(labels) - 0.6, -0.85)
    ax.set(xlabel="share of the step", xlim=(0, 1), title="the planner's best layouts (MFU)")
    below = -0.32 * 6 / (len(labels) + 2)    # under the x label, whatever the number of bars
    ax.legend(fontsize=7.5, ncol=7, loc="upper center", bbox_to_anchor=(0.5, below), frameon=False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ the grid on the machines
def plot_replicas_on_pods(tp: int = 8, cp: int = 1, pp: int = 16, dp: int = 64,
                         gpus_per_node: int = 8, gpus_per_rack: int = 16, pod_size: int = 3072):
    """The [TP, CP, PP, DP] grid laid onto servers, racks and pods. Ranks are consecutive
    GPUs, so one model replica (dp coordinate, `ProcessGrid.coords`) is a row of t*c*p GPUs;
    the colour is the pod each GPU sits in; thin lines are servers, thicker ones racks.
    Beside it, the link each axis's group crosses (`costmodel.hardware`)."""
    grid = ProcessGrid(tp, cp, pp, dp)
    replica = tp * cp * pp
    pods = [[(r * replica + i) // pod_size for i in range(replica)] for r in range(dp)]
    assert all(grid.coords(r * replica)["dp"] == r for r in range(dp))
    fig, (ax, side) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 4.2),
                                   gridspec_kw={"width_ratios": [3, 1.25]})
    ax.imshow(pods, aspect="auto", cmap="Pastel1", interpolation="nearest",
              extent=(0, replica, dp, 0))
    if replica // gpus_per_node <= 64:          # more servers than that: lines hide the colour
        for x in range(0, replica + 1, gpus_per_node):
            ax.axvline(x, color="grey", lw=0.3 if x % gpus_per_rack else 0.9)
    straddle = [r for r in range(dp) if len(set(pods[r])) > 1]
    for r in straddle:
        ax.add_patch(Rectangle((0, r), replica, 1, fill=False, edgecolor="black", lw=1.2))
    ax.set_xlabel(f"GPU within one model replica (TP x CP x PP = {replica});\nservers of "
                  f"{gpus_per_node}, racks of {gpus_per_rack}", fontsize=8)
    ax.set_ylabel(f"DP replica (of {dp})", fontsize=8)
    ax.set_title(f"TP{tp} CP{cp} PP{pp} DP{dp} on pods of {pod_size:,}: colour = pod"
                 + (f";\nboxed: {len(straddle)} replicas straddle two pods" if straddle else ""),
                 fontsize=8)
    side.axis("off")
    side.text(0, 1, "\n\n".join(_axis_links(tp, cp, pp, dp, gpus_per_node, pod_size)),
              va="top", fontsize=7.5, family="monospace")
    fig.tight_layout()
    return fig


def _axis_links(tp, cp, pp, dp, gpus_per_node, pod_size) -> list[str]:
    """One line per axis: its group's span in GPUs and the slowest link it crosses."""
    strides = {"TP": (1, tp), "CP": (tp, cp), "PP": (tp * cp, pp), "DP": (tp * cp * pp, dp)}
    out = []
    for name, (stride, size) in strides.items():
        span = stride * (size - 1) + 1
        link = ("-" if size == 1 else "NVLink" if span <= gpus_per_node
                else "NICs, one pod" if span <= pod_size else "NICs, across pods")
        out.append(f"{name}{size:<5} spans {span:>6,} GPUs\n       {link}")
    return out


# ------------------------------------------------------------------ the rules, as the page draws them
def place_pairs(ax, points: dict, left: bool = False):
    """The worked pairs on a threshold plot: {label: (x, y)}, each a marker with its label
    (to the marker's left with `left`, where the right edge would cut it)."""
    for (label, (x, y)), marker in zip(points.items(), ("*", "D", "s")):
        ax.plot([x], [y], marker, color="k", ms=9 if marker == "*" else 6, zorder=5)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(-6 if left else 6, 4),
                    fontsize=7, ha="right" if left else "left")


def _pairs():
    """(key, model, cluster, planned Estimate) of each worked pair (`numbers.fourd.WORKED`)."""
    return [(key, ModelConfig.preset(name), worked_cluster(gpu), worked_plan(key))
            for key, (name, gpu, *_) in WORKED.items()]


def tp_rule(widths=(2048, 4096, 8192, 16384), degrees=(2, 4, 8, 16)):
    """Rule 2 from `costmodel.rules.tp_ratio` on Llama 3's cluster (`plot_tp_threshold`), with
    each worked pair at its width and the TP the planner chose (on its own cluster)."""
    ratio = lambda t, h, o: rules.tp_ratio(rules.llama_of_width(h), t, LLAMA3_CLUSTER, overlap=o)  # noqa: E731
    fig = plot_tp_threshold(list(widths), {t: [ratio(t, h, False) for h in widths] for t in degrees},
                            {t: [max(ratio(t, h, True), 1e-3) for h in widths] for t in degrees})
    place_pairs(fig.axes[0], {f"{k} TP{e.parallel.tp}": (m.dim, max(rules.tp_ratio(m, e.parallel.tp, c), 1e-3))
                              for k, m, c, e in _pairs()}, left=True)
    return fig


def bubble_rule(ms=(1, 4, 8, 16, 32, 64, 128), layouts=((4, 1), (16, 1), (16, 8))):
    """Rule 3: `formulas.pipeline_parallel.bubble_fraction` against micro-batches
    (`plot_bubble_threshold`), with each worked pair's planned pipeline."""
    fig = plot_bubble_threshold(list(ms), {
        f"p={p} v={v}": [bubble_fraction("interleaved" if v > 1 else "1f1b", p, m, v) for m in ms]
        for p, v in layouts})
    place_pairs(fig.axes[0], {f"{k} PP{e.parallel.pp} v{e.parallel.virtual_stages}": (e.microbatches, e.bubble_fraction)
                              for k, _, _, e in _pairs()})
    return fig


def cp_rule(seq_lens=(8192, 16384, 32768, 65536, 131072)):
    """Rule 4 (`plot_cp_threshold`): attention's share of a 405B block and CP's unhidden
    traffic over attention, with each worked pair's share at its sequence (the planner
    chose no CP for any of them) and Table 4's 128K row, TP8 CP16."""
    m, c = ModelConfig.preset("llama3-405b"), LLAMA3_CLUSTER
    cp = {f"CP{n} {impl}": [rules.cp_ratio(m, s, n, c, impl=impl) for s in seq_lens]
          for n, impl in ((4, "allgather"), (16, "allgather"), (16, "ring"))}
    fig = plot_cp_threshold(list(seq_lens), [rules.attention_share(m, s, c) for s in seq_lens], cp)
    place_pairs(fig.axes[0], {f"{k} CP{e.parallel.cp}": (e.workload.seq_len, rules.attention_share(
        model, e.workload.seq_len, cluster, tp=e.parallel.tp)) for k, model, cluster, e in _pairs()})
    place_pairs(fig.axes[1], {"405B at 128K, CP16 (Table 4)": (131072, rules.cp_ratio(m, 131072, 16, c))},
                left=True)
    return fig


def dp_rule(dps=(8, 32, 128, 512), frameworks=DP_FRAMEWORKS):
    """Rule 5 (`plot_dp_threshold`): exposed DP over the step of Llama 3 70B at TP8 against
    tokens per DP rank (a batch of `DP_RULE_BATCH` sequences of 8K), a line per framework (its reduce
    dtype, buckets and ZeRO stage), and each worked pair at its planned DP."""
    shares = {f"70B TP8, {fw}": [dp_rule_share(d, fw) for d in dps] for fw in frameworks}
    fig = plot_dp_threshold([DP_RULE_BATCH * 8192 // d for d in dps], shares)
    place_pairs(fig.axes[0], {f"{k} DP{e.parallel.dp}": (e.workload.tokens / e.parallel.dp,
                                                          e.time_breakdown_s["dp"] / e.step_time_s)
                              for k, _, _, e in _pairs()})
    fig.axes[0].set_yscale("symlog", linthresh=0.01)
    return fig


# ------------------------------------------------------------------ Llama 3, replayed
STEP_PARTS = {"compute": "compute and optimizer", "tp": "TP exposed", "pp": "PP exposed",
              "dp": "DP exposed", "bubble": "bubble"}


def replayed_parts(run) -> dict[str, float]:
    """A replayed step's seconds by part: each axis's exposed time, the bubble (idle, neither
    computing nor communicating) and the rest, which is computation."""
    parts = {a: run.exposed_s[a] for a in ("tp", "pp", "dp")}
    parts["bubble"] = run.bubble_fraction * run.step_time_s
    return {"compute": run.step_time_s - sum(parts.values()), **parts}


def estimated_parts(est) -> dict[str, float]:
    """The cost model's step by the same parts (its compute includes the optimizer)."""
    t = est.time_breakdown_s
    return {"compute": t["compute"] + t["optimizer"], **{k: t[k] for k in ("tp", "pp", "dp", "bubble")}}


def plot_llama3_replayed_parts():
    """Table 4's first row as it runs (PP16 interleaved, TP8 with SP, DP64):
    where one step's time goes, replayed on H100s from the program of 32 gloo ranks, and as
    the cost model estimates the same step. Each bar adds up to the step."""
    bars = {"replayed": replayed_parts(replays.replayed("llama3")),
            "cost model,\nsame step": estimated_parts(replays.estimated("llama3"))}
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH - 0.5, 2.2))
    for y, (label, parts) in enumerate(bars.items()):
        left = 0.0
        for part, seconds in parts.items():
            colour = COLORS["tp time" if part == "tp" else part]     # blue is compute's
            ax.barh(y, seconds, left=left, color=colour, height=0.6,
                    label=STEP_PARTS[part] if y == 0 else None)
            left += seconds
        ax.text(left, y, f" {left:.3g} s", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels(list(bars), fontsize=8)
    ax.set_ylim(len(bars) - 0.5, -0.5)
    ax.set_xlim(0, 1.12 * max(sum(p.values()) for p in bars.values()))
    ax.set_xlabel("seconds of one step, per GPU")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5, fontsize=7, frameon=False)
    fig.tight_layout()
    return fig
