"""Figures the book draws. Each function returns a matplotlib Figure and draws nothing else:
no global state, no timestamps, the same picture for the same arguments.

Grouped by chapter; each group reads only pure results (estimates, logs, schedules).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

AXIS_COLORS = {"tp": "#4C72B0", "cp": "#55A868", "pp": "#C44E52", "dp": "#8172B2"}
AXIS_NAMES = {"tp": "tensor (TP)", "cp": "context (CP)", "pp": "pipeline (PP)", "dp": "data (DP)"}


# --- cost model figures ---------------------------------------------------------------
def table4_figure(results=None):
    """Published vs predicted MFU for the three rows of Llama 3's Table 4, with the +-3 point
    band the prediction must fall in. `results`: `costmodel.table4()` (computed if None)."""
    from . import costmodel

    results = results if results is not None else costmodel.table4()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = range(len(results))
    published = [100 * row.mfu for row, _ in results]
    predicted = [100 * est.mfu for _, est in results]
    ax.bar([x - 0.2 for x in xs], published, 0.4, label="published (Llama 3, Table 4)", color="#999999")
    ax.bar([x + 0.2 for x in xs], predicted, 0.4, label="predicted (minipar.costmodel)", color="#4C72B0")
    for x, p, q in zip(xs, published, predicted):
        ax.add_patch(Rectangle((x - 0.42, p - 3), 0.84, 6, fill=False, ls=":", ec="black", lw=0.8))
        ax.text(x - 0.2, p + 0.4, f"{p:.0f}", ha="center", fontsize=9)
        ax.text(x + 0.2, q + 0.4, f"{q:.1f}", ha="center", fontsize=9)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{row.gpus:,} GPUs\nTP{row.tp} CP{row.cp} PP{row.pp} DP{row.dp}\nseq {row.seq_len:,}"
                        for row, _ in results], fontsize=8)
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(0, 55)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Llama 3 405B: one set of constants, three rows (dotted: +-3 points)", fontsize=10)
    fig.tight_layout()
    return fig


def comm_volume_figure(estimates: dict, cluster=None):
    """Bytes each GPU sends per step, stacked by axis (left), and the seconds those bytes
    take on their links (right): bytes are not time, TP's are many but travel on NVLink.
    `estimates`: {label: Estimate}."""
    from . import costmodel

    cluster = cluster or costmodel.LLAMA3_CLUSTER
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = list(estimates)
    for i, label in enumerate(labels):
        e = estimates[label]
        bottom = 0.0
        for axis in ("tp", "cp", "pp", "dp"):
            gb = e.comm_bytes_per_gpu[axis] / 1e9
            ax.bar(i, gb, bottom=bottom, color=AXIS_COLORS[axis], label=AXIS_NAMES[axis] if i == 0 else None)
            bottom += gb
        bottom = 0.0
        for axis in ("tp", "cp", "pp", "dp"):
            s = wire_seconds(e, axis, cluster)
            bx.bar(i, s, bottom=bottom, color=AXIS_COLORS[axis])
            bottom += s
    for a, title, unit in ((ax, "bytes sent per GPU per step", "GB"),
                           (bx, "time on the wire (not all exposed)", "s")):
        a.set_xticks(range(len(labels)))
        a.set_xticklabels(labels, fontsize=8)
        a.set_ylabel(unit)
        a.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def wire_seconds(e, axis: str, cluster) -> float:
    """Seconds pipeline rank 0's bytes of `axis` take at its group's bandwidth."""
    from . import costmodel

    pc = e.parallel
    stride, size = {"tp": (1, pc.tp), "cp": (pc.tp, pc.cp), "pp": (pc.tp * pc.cp, pc.pp),
                    "dp": (pc.tp, pc.dp * pc.cp)}[axis]
    if size <= 1:
        return 0.0
    span = costmodel.dp_group_span(pc) if axis == "dp" else None
    bw = costmodel.group_bandwidth_GBps(cluster, stride, size, pc.world_size, span)
    return e.comm_bytes_per_gpu[axis] / (bw * costmodel.LLAMA3_EFFICIENCY.network * 1e9)


def memory_figure(estimates: dict, hbm_gb: float = 80.0):
    """Memory of the most loaded GPU, stacked: parameters, gradients, optimizer state,
    activations; the dashed line is the HBM. `estimates`: {label: Estimate}."""
    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "activations": "#C44E52"}
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(estimates) + 2), 3.6))
    for i, (label, e) in enumerate(estimates.items()):
        bottom = 0.0
        for part, gb in e.memory_breakdown_gb.items():
            ax.bar(i, gb, bottom=bottom, color=colors[part], label=part if i == 0 else None)
            bottom += gb
        ax.text(i, bottom + 1, f"{bottom:.0f}", ha="center", fontsize=8)
    ax.axhline(hbm_gb, ls="--", color="black", lw=1)
    ax.text(len(estimates) - 0.5, hbm_gb + 1, f"HBM {hbm_gb:g} GB", ha="right", fontsize=8)
    ax.set_xticks(range(len(estimates)))
    ax.set_xticklabels(list(estimates), fontsize=8)
    ax.set_ylabel("GB per GPU")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("memory of the most loaded GPU", fontsize=10)
    fig.tight_layout()
    return fig


def network_figure(parallel=None, cluster=None):
    """The network hierarchy (server -> rack -> pod -> cluster) on a log scale of GPUs, with
    the range of GPUs each parallel axis's groups cover under the [TP, CP, PP, DP] order."""
    from . import costmodel

    cluster = cluster or costmodel.LLAMA3_CLUSTER
    pc = parallel or costmodel.TABLE4[2].parallel()
    levels = [
        ("server", 1, cluster.gpus_per_node, f"NVLink {cluster.intra_node_GBps:g} GB/s", "#DCE9F5"),
        ("rack", cluster.gpus_per_node, cluster.gpus_per_rack, "ToR switch", "#E6F2E1"),
        ("pod", cluster.gpus_per_rack, cluster.pod_size,
         f"RoCE {cluster.inter_node_Gbps:g} Gb/s, full bisection", "#F7E6D6"),
        ("cluster", cluster.pod_size, cluster.n_gpus, f"1:{cluster.pod_oversubscription:g} between pods", "#EEE0EE"),
    ]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.set_xscale("log", base=2)
    for name, lo, hi, link, color in levels:
        ax.axvspan(lo, hi, color=color, zorder=0)
        ax.text((lo * hi) ** 0.5, 4.55, f"{name}\n(up to {hi:,})", ha="center", va="center", fontsize=8)
        ax.text((lo * hi) ** 0.5, -0.75, link, ha="center", va="center", fontsize=7)
    spans = [("tp", 1, pc.tp), ("cp", pc.tp, pc.tp * pc.cp), ("pp", pc.tp * pc.cp, pc.tp * pc.cp * pc.pp),
             ("dp", pc.tp * pc.cp * pc.pp, pc.world_size)]
    for y, (axis, lo, hi) in zip((3.3, 2.4, 1.5, 0.6), spans):
        if hi > lo:
            ax.barh(y, hi - lo, left=lo, height=0.55, color=AXIS_COLORS[axis])
        ax.text(hi * 1.08 if hi > lo else lo * 1.08, y,
                f"{AXIS_NAMES[axis]} = {hi // lo}" + ("" if hi > lo else " (unused)"),
                va="center", fontsize=8)
    ax.set_xlim(1, cluster.n_gpus * 1.05)
    ax.set_ylim(-1.2, 5.2)
    ax.set_yticks([])
    ax.set_xlabel("GPUs spanned by one group (log scale)")
    ax.set_title(f"where each axis sits: TP{pc.tp} CP{pc.cp} PP{pc.pp} DP{pc.dp} on {pc.world_size:,} GPUs",
                 fontsize=10)
    fig.tight_layout()
    return fig


def constants_figure(dense=None, attention=None, tolerance: float = 0.03, counts=None):
    """Which (dense, attention) efficiency constants put all three Table 4 rows within
    +-`tolerance` of the published MFU: the shaded region, with the book's choice marked.
    `counts`: `costmodel.table4_fit_counts(dense, attention, tolerance)` if already known."""
    import numpy as np

    from . import costmodel

    dense = dense if dense is not None else np.linspace(0.40, 0.70, 31)
    attention = attention if attention is not None else np.linspace(0.10, 0.50, 41)
    ok = np.array(counts if counts is not None else costmodel.table4_fit_counts(dense, attention, tolerance))
    fig, ax = plt.subplots(figsize=(6, 4))
    mesh = ax.pcolormesh(dense, attention, ok, shading="nearest", cmap="Blues", vmin=0, vmax=3)
    cbar = fig.colorbar(mesh, ax=ax, ticks=[0, 1, 2, 3])
    cbar.set_label(f"rows within +-{100 * tolerance:.0f} points")
    best = costmodel.LLAMA3_EFFICIENCY
    ax.plot(best.dense, best.attention, "r*", ms=12, label="the book's constants")
    ax.set_xlabel("dense efficiency (fraction of peak)")
    ax.set_ylabel("attention efficiency (fraction of peak)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("how tightly Table 4 pins the two compute constants", fontsize=10)
    fig.tight_layout()
    return fig


def measured_vs_predicted_figure(measured: dict, predicted: dict, title: str = ""):
    """Wire bytes per axis as CommLog measured them (rank 0) next to the cost model's
    prediction. measured: {axis: {op: {"wire_bytes": ...}}} (the `comm` of --log-json);
    predicted: {axis: bytes} (`costmodel.comm_bytes_per_gpu`)."""
    axes = [a for a in ("tp", "cp", "pp", "dp") if predicted.get(a) or measured.get(a)]
    got = [sum(op["wire_bytes"] for op in measured.get(a, {}).values()) / 1e3 for a in axes]
    want = [predicted.get(a, 0) / 1e3 for a in axes]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = range(len(axes))
    ax.bar([x - 0.2 for x in xs], got, 0.4, label="measured (CommLog)", color="#999999")
    ax.bar([x + 0.2 for x in xs], want, 0.4, label="predicted (cost model)",
           color=[AXIS_COLORS[a] for a in axes])
    ax.set_xticks(list(xs))
    ax.set_xticklabels([AXIS_NAMES[a] for a in axes], fontsize=8)
    ax.set_ylabel("kB sent by rank 0 per step")
    ax.legend(fontsize=8)
    ax.set_title(title or "tiny gloo run: measured vs predicted", fontsize=10)
    fig.tight_layout()
    return fig


# --- collectives and data-parallel figures ---
# Bytes on the wire against the ring formulas, the alpha-beta time of an all-reduce, the
# overlap timeline of one data-parallel step, ZeRO memory per rank, and loss curves. Each
# takes plain numbers (from CommLog, DataParallel.timeline, DataParallel.memory_bytes or
# train()'s records), so the notebooks measure and these only draw.

# Bytes one rank sends, as a fraction of the message S, under the ring algorithm. Written
# out here (not taken from minipar.comm) so that the figure checks the log, not itself.
RING_FRACTION = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
}
RING_LABEL = {"all_reduce": "all-reduce  2(n-1)/n", "all_gather": "all-gather  (n-1)/n",
              "reduce_scatter": "reduce-scatter  (n-1)/n", "send": "send (p2p)  1"}


def plot_ring_bytes(measured: dict, size: int, extra: dict | None = None, ax=None):
    """Measured wire bytes per rank over S (points) against the ring formulas (lines).

    measured: {op: {n: wire_bytes}} for a message of `size` bytes; extra: more point series
    {label: {n: wire_bytes}} drawn on top (e.g. an all-reduce written by hand from sends).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ns = sorted({n for per_n in measured.values() for n in per_n})
    line_n = [x / 10 for x in range(10 * ns[0], 10 * ns[-1] + 1)]
    # all-gather and reduce-scatter coincide: a hollow ring around a small square
    style = {"all_reduce": dict(marker="o"), "send": dict(marker="^"),
             "all_gather": dict(marker="o", markerfacecolor="none", markersize=11),
             "reduce_scatter": dict(marker="s", markersize=5)}
    for op, per_n in measured.items():
        drawn = ax.plot(line_n, [RING_FRACTION[op](n) for n in line_n], "-", linewidth=1,
                        alpha=0.7)
        ax.plot(sorted(per_n), [per_n[n] / size for n in sorted(per_n)], linestyle="none",
                color=drawn[0].get_color(), label=RING_LABEL.get(op, op),
                **style.get(op, dict(marker="o")))
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


def all_reduce_time(size: float, n: int, alpha: float, bandwidth: float) -> float:
    """The alpha-beta model of a ring all-reduce of `size` bytes over n ranks: 2(n-1) steps,
    each paying the latency alpha, and 2(n-1)/n * size bytes through one link."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bandwidth


def plot_all_reduce_time(links: dict, sizes, measured: dict | None = None, ax=None):
    """Model all-reduce time against message size on log axes, one line per link.

    links: {label: (n, alpha_s, bandwidth_bytes_per_s)}; measured: {label: {size: seconds}},
    drawn as points (e.g. gloo on this machine, with its own fitted line in `links`).
    """
    import matplotlib.pyplot as plt

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


def overlap_rows(events):
    """From a DataParallel timeline [(event, bucket, t)] (plus the caller's forward /
    backward / end marks with bucket None): the compute spans and, per bucket, when its
    collective was launched, completed and waited for. Pure; the plot draws what it returns."""
    marks = {e: t for e, i, t in events if i is None}
    buckets: dict[int, dict] = {}
    for e, i, t in events:
        if i is not None:
            buckets.setdefault(i, {})[e] = t
    compute = [("forward", marks["forward"], marks["backward"]),
               ("backward", marks["backward"], marks["backward end"])]
    return compute, dict(sorted(buckets.items())), marks


def plot_overlap_timeline(runs: dict, ax=None):
    """One panel per run: forward and backward on the top row, then each bucket's
    collective as a bar from launch to completion (a tick where the wait returned), and a
    dashed line where every gradient is summed and the optimizer may step.

    runs: {title: events}, events as `overlap_rows` takes them (times in seconds).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(len(runs), 1, figsize=(8, 2.6 * len(runs)), sharex=True,
                             squeeze=False)
        ax = ax[:, 0]
    axes = list(ax) if hasattr(ax, "__len__") else [ax]
    colours = {"forward": "#4C72B0", "backward": "#DD8452"}
    for a, (title, events) in zip(axes, runs.items()):
        compute, buckets, marks = overlap_rows(events)
        for name, t0, t1 in compute:
            a.barh(0, t1 - t0, left=t0, height=0.8, color=colours[name], edgecolor="black",
                   linewidth=0.5, label=name)
        # buckets share rows 1..6 however many there are (naive: one per parameter)
        rows = max(len(buckets), 6)
        pitch = 6 / rows
        ys = [1 + k * pitch for k in range(len(buckets))]
        for y, (i, ev) in zip(ys, buckets.items()):
            end = ev.get("complete", ev.get("done", ev["launch"]))
            a.barh(y, end - ev["launch"], left=ev["launch"], height=0.8 * pitch,
                   color="#55A868", edgecolor="black" if pitch > 0.5 else "none", linewidth=0.5,
                   label="all-reduce, launch to complete" if y == 1 else None)
            if "done" in ev:
                a.plot([ev["done"]] * 2, [y - 0.4 * pitch, y + 0.4 * pitch], color="black",
                       linewidth=1, label="wait returned" if y == 1 else None)
        a.axvline(marks["synced"], color="black", linestyle="--", linewidth=1,
                  label="gradients summed")
        a.set_ylim(1 + (len(buckets) - 1) * pitch + 0.5 * max(pitch, 1), -0.5)
        shown = list(zip(ys, buckets)) if len(buckets) <= 12 else \
            [(ys[0], next(iter(buckets))), (ys[-1], list(buckets)[-1])]
        a.set_yticks([0] + [y for y, _ in shown])
        a.set_yticklabels(["compute"] + [f"bucket {i}" for _, i in shown], fontsize=8)
        a.set_title(f"{title}: gradients summed at {marks['synced'] - marks['forward']:.3f} s",
                    fontsize=10)
        a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    axes[-1].set_xlabel("time since the forward pass began (s)")
    return axes


ZERO_PARTS = ("params", "grads", "optimizer")
ZERO_COLOURS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}


def zero_bytes_per_param(stage: int, n: int, param: float = 2, grad: float = 2,
                         optimizer: float = 12) -> dict[str, float]:
    """Bytes per parameter one rank holds at ZeRO `stage` over n ranks (the ZeRO paper's
    2 + 2 + K, K = 12 for mixed-precision Adam: fp32 master weight, m and v)."""
    return {"params": param / (n if stage >= 3 else 1), "grads": grad / (n if stage >= 2 else 1),
            "optimizer": optimizer / (n if stage >= 1 else 1)}


def plot_zero_memory(per_stage: dict, unit: float = 1e6, unit_name: str = "MB",
                     title: str = "", limit: float | None = None, limit_label: str = "",
                     ax=None):
    """Stacked bars of what one rank holds, per ZeRO stage: {stage: {params, grads,
    optimizer}} in bytes. `limit` draws a horizontal line (e.g. a GPU's memory)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    stages = list(per_stage)
    bottom = [0.0] * len(stages)
    for part in ZERO_PARTS:
        vals = [per_stage[s][part] / unit for s in stages]
        ax.bar(range(len(stages)), vals, bottom=bottom, color=ZERO_COLOURS[part],
               edgecolor="black", linewidth=0.5, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for x, total in enumerate(bottom):
        ax.text(x, total, f"{total:,.0f}" if total >= 100 else f"{total:.3g}", ha="center",
                va="bottom", fontsize=8)
    top = max(bottom)
    if limit is not None:
        ax.axhline(limit / unit, color="red", linestyle="--", linewidth=1,
                   label=limit_label or None)
        top = max(top, limit / unit)
    ax.set_xticks(range(len(stages)))
    ax.set_xticklabels([f"ZeRO-{s}" if isinstance(s, int) else str(s) for s in stages])
    ax.set_ylabel(f"per rank ({unit_name})")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(0, top * 1.15)
    ax.legend(fontsize=8)
    return ax


def plot_comm_per_stage(comm_by_run: dict, grad_bytes: int, formulas: dict | None = None,
                        ax=None):
    """Data-parallel bytes sent per rank and step, by op, over the gradient bytes G:
    {label: {op: wire_bytes}}; `formulas` {label: value} marks the expected multiple of G."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    colours = {"all_reduce": "#4C72B0", "reduce_scatter": "#DD8452", "all_gather": "#55A868"}
    labels = list(comm_by_run)
    bottom = [0.0] * len(labels)
    for op, colour in colours.items():
        vals = [comm_by_run[k].get(op, 0) / grad_bytes for k in labels]
        if any(vals):
            ax.bar(range(len(labels)), vals, bottom=bottom, color=colour, edgecolor="black",
                   linewidth=0.5, label=op.replace("_", "-"))
            bottom = [b + v for b, v in zip(bottom, vals)]
    for x, k in enumerate(labels):
        if formulas and k in formulas:
            ax.plot([x - 0.4, x + 0.4], [formulas[k]] * 2, color="black", linewidth=2,
                    label="formula" if x == 0 else None)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([k.replace(", ", "\n") for k in labels], fontsize=8)
    ax.set_ylabel("bytes sent per rank / G")
    ax.set_title("data-parallel traffic per step (G = gradient bytes)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_loss_curves(curves: dict, reference: str, ax=None):
    """Loss per step of several layouts over the reference's; the reference is drawn wide
    underneath so that coinciding curves are visible as coinciding."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    ref = curves[reference]
    ax.plot(range(len(ref)), ref, color="lightgrey", linewidth=6, label=reference, zorder=1)
    markers = "os^vD<>p*h"
    for k, (label, losses) in enumerate((l, c) for l, c in curves.items() if l != reference):
        ax.plot(range(len(losses)), losses, marker=markers[k % len(markers)], markersize=4,
                linewidth=1, label=label, zorder=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return ax
# --- end of collectives and data-parallel figures ---


# --- tensor parallel figures ---
TP_PARTS = ("params", "grads", "optimizer")
TP_PART_COLOURS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}


def plot_tp_memory(measured: dict, formula: dict | None = None, unit: float = 1e6,
                   unit_name: str = "MB", ax=None):
    """What one TP rank holds, {tp: {params, grads, optimizer}} in bytes, as stacked bars;
    `formula` {tp: bytes} marks the expected total of each bar."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    tps = sorted(measured)
    bottom = [0.0] * len(tps)
    for part in TP_PARTS:
        vals = [measured[t][part] / unit for t in tps]
        ax.bar(range(len(tps)), vals, bottom=bottom, color=TP_PART_COLOURS[part],
               edgecolor="black", linewidth=0.5, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if formula:
        for x, t in enumerate(tps):
            ax.plot([x - 0.4, x + 0.4], [formula[t] / unit] * 2, color="black", linewidth=2,
                    label="formula" if x == 0 else None)
    ax.set_xticks(range(len(tps)))
    ax.set_xticklabels([f"tp={t}" for t in tps])
    ax.set_ylabel(f"per rank ({unit_name})")
    ax.set_title("model state per rank under tensor parallelism", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_tp_comm(measured: dict, formula, tps=(1, 2, 4, 8), unit: float = 1e6,
                 unit_name: str = "MB", ax=None):
    """TP bytes one rank sends per step: `measured` {(tp, sp): bytes} as markers over the
    lines of `formula(tp, sp) -> bytes` for each tp in `tps`."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    styles = {False: ("#4C72B0", "o", "all-reduce (no SP)"),
              True: ("#DD8452", "s", "all-gather + reduce-scatter (SP)")}
    for sp, (colour, marker, label) in styles.items():
        ax.plot(tps, [formula(t, sp) / unit for t in tps], color=colour, linewidth=1.5,
                linestyle="-" if not sp else "--", label=f"formula, {label}")
        pts = sorted((t, b) for (t, s), b in measured.items() if s == sp)
        if pts:
            ax.plot([t for t, _ in pts], [b / unit for _, b in pts], linestyle="none",
                    marker=marker, markersize=6 if sp else 11, markerfacecolor="none", color=colour,
                    markeredgewidth=2, label=f"measured, {label}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(tps))
    ax.set_xticklabels([str(t) for t in tps])
    ax.set_xlabel("tensor-parallel degree t")
    ax.set_ylabel(f"sent per rank per step ({unit_name})")
    ax.set_title("TP traffic: measured (CommLog) vs formula", fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_saved_activations(measured: dict, unit: float = 1e6, unit_name: str = "MB", ax=None):
    """Bytes one rank saves for the backward, {label: bytes}, as bars (e.g. per tp, SP or not)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    labels = list(measured)
    vals = [measured[k] / unit for k in labels]
    colours = ["#DD8452" if "SP" in k else "#4C72B0" for k in labels]
    ax.bar(range(len(labels)), vals, color=colours, edgecolor="black", linewidth=0.5)
    for x, v in enumerate(vals):
        ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(f"saved for backward ({unit_name})")
    ax.set_ylim(0, max(vals) * 1.15)
    ax.set_title("activations one rank keeps for the backward", fontsize=10)
    return ax


# --- context parallel figures ---
# The causal attention matrix cut into 2*cp chunks, the work each rank does under the naive
# and the load-balanced ("zigzag") layouts, activation memory against sequence length, and
# ring vs all-gather bytes. The data comes from minipar.parallel.context (pure functions).
CP_LAYOUTS = ("contiguous", "zigzag")


def _cp_layout(name: str):
    from .parallel import context
    return {"contiguous": context.contiguous_chunks, "zigzag": context.zigzag_chunks}[name]


def _rank_colours(cp: int):
    cmap = plt.get_cmap("tab10" if cp <= 10 else "tab20")
    return [cmap(r % cmap.N) for r in range(cp)]


def plot_cp_layout(cp: int = 4, layout: str = "zigzag", ax=None):
    """The causal attention matrix at chunk resolution: query chunks down, key chunks across,
    each block coloured by the rank whose queries it serves. Full squares below the diagonal,
    triangles on it (causal inside the chunk), nothing above (masked: never computed)."""
    from matplotlib.patches import Polygon
    from .parallel.context import attention_work

    chunks = _cp_layout(layout)
    n = 2 * cp
    owner = {ch: r for r in range(cp) for ch in chunks(r, cp)}
    colours = _rank_colours(cp)
    if ax is None:
        _, ax = plt.subplots(figsize=(3.6, 3.6))
    for qc in range(n):
        for kc in range(qc + 1):
            c = colours[owner[qc]]
            if kc < qc:
                ax.add_patch(Rectangle((kc, qc), 1, 1, facecolor=c, edgecolor="white", linewidth=1))
            else:   # the diagonal block: the lower triangle (key <= query)
                ax.add_patch(Polygon([(kc, qc), (kc, qc + 1), (kc + 1, qc + 1)], closed=True,
                                     facecolor=c, edgecolor="white", linewidth=1))
    for qc in range(n):
        ax.text(n + 0.15, qc + 0.5, f"rank {owner[qc]}", va="center", fontsize=7,
                color=colours[owner[qc]])
    ax.set_xlim(0, n + 1.3)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    ax.set_xticks([i + 0.5 for i in range(n)])
    ax.set_xticklabels([str(i) for i in range(n)], fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(n)])
    ax.set_yticklabels([str(i) for i in range(n)], fontsize=7)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    work = attention_work(2 * cp * 64, cp, chunks)
    ax.set_title(f"{layout}, cp={cp}: busiest / idlest rank = {max(work) / min(work):.2f}",
                 fontsize=9)
    return ax


def plot_cp_work(cp: int = 4, seq_len: int | None = None, measured: dict | None = None, ax=None):
    """Attention work per rank (scores computed, from the ring schedule) for both layouts,
    as a fraction of a perfectly fair share. `measured`: {layout: [seconds per rank]},
    drawn as markers on the same scale (each normalised by its layout's mean)."""
    from .parallel.context import attention_work

    seq_len = seq_len or 2 * cp * 64
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    width = 0.38
    for i, name in enumerate(CP_LAYOUTS):
        work = attention_work(seq_len, cp, _cp_layout(name))
        fair = sum(work) / cp
        xs = [r + (i - 0.5) * width for r in range(cp)]
        ax.bar(xs, [w / fair for w in work], width, label=f"{name} (schedule)",
               color=("#C44E52", "#55A868")[i], edgecolor="black", linewidth=0.5)
        if measured and name in measured:
            m = measured[name]
            mean = sum(m) / len(m)
            ax.plot(xs, [t / mean for t in m], linestyle="none", marker="D", color="black",
                    markersize=5, label="measured CPU time" if i == 0 else None)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xticks(range(cp))
    ax.set_xticklabels([f"rank {r}" for r in range(cp)])
    ax.set_ylabel("attention work / fair share")
    ax.set_title(f"causal attention work per rank, cp={cp}, {seq_len} tokens", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_cp_memory(seq_lens, measured: dict, unit: float = 1e6, unit_name: str = "MB", ax=None):
    """Bytes saved for the backward per rank against sequence length; `measured` is
    {cp: [bytes for each seq_len]} (cp = 1 is the single device)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, (cp, values) in enumerate(sorted(measured.items())):
        ax.plot(seq_lens, [v / unit for v in values], marker="os^D"[i % 4],
                label="one device" if cp == 1 else f"cp={cp}, per rank")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(list(seq_lens))
    ax.set_xticklabels([str(s) for s in seq_lens])
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(f"saved for backward ({unit_name})")
    ax.set_title("activation memory per rank (measured)", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_cp_bytes(model, cps=(2, 4, 8, 16, 32), seq_lens=(8192, 32768, 131072), tp: int = 8,
                  dtype_bytes: int = 2, axes=None):
    """Bytes one rank sends per layer (forward + backward, one sequence), ring vs all-gather.
    Left: against cp at the longest sequence. Right: against sequence length at cp=16."""
    from .parallel.context import cp_wire_bytes_per_step

    def per_layer(s, cp, impl):
        return cp_wire_bytes_per_step(model, 1, s, cp, impl, tp=tp, n_layers=1,
                                      dtype_bytes=dtype_bytes) / 1e6
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    styles = {"ring": ("#4C72B0", "o"), "allgather": ("#DD8452", "s")}
    s_max = max(seq_lens)
    for impl, (colour, marker) in styles.items():
        axes[0].plot(cps, [per_layer(s_max, cp, impl) for cp in cps], color=colour,
                     marker=marker, label=impl)
        axes[1].plot(seq_lens, [per_layer(s, 16, impl) for s in seq_lens], color=colour,
                     marker=marker, label=impl)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(list(cps))
    axes[0].set_xticklabels([str(c) for c in cps])
    axes[0].set_xlabel("context-parallel degree cp")
    axes[0].set_title(f"{s_max:,} tokens", fontsize=10)
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xticks(list(seq_lens))
    axes[1].set_xticklabels([f"{s // 1024}K" for s in seq_lens])
    axes[1].set_xlabel("sequence length")
    axes[1].set_title("cp = 16", fontsize=10)
    axes[0].set_ylim(0, None)
    for ax in axes:
        ax.set_ylabel("MB sent per rank per layer")
        ax.legend(fontsize=8)
    axes[0].figure.suptitle(f"{model.name}: K/V traffic per rank (tp={tp}, "
                            f"{dtype_bytes}-byte values)", fontsize=10)
    return axes


def plot_allgather_mask(seq_len: int = 32, cp: int = 4, rank: int = 1, doc_lens=None, ax=None):
    """What one rank's queries may see after the all-gather: its s/cp queries (rows, in the
    order it holds them) against all gathered keys (columns, in rank order). With
    `doc_lens` (document lengths summing to seq_len) the document mask is added: one line."""
    import torch
    from .parallel.context import local_positions

    q_pos = local_positions(seq_len, rank, cp)
    k_pos = torch.cat([local_positions(seq_len, r, cp) for r in range(cp)])
    mask = q_pos[:, None] >= k_pos[None, :]
    if doc_lens:
        doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
        mask &= doc[q_pos][:, None] == doc[k_pos][None, :]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.2))
    ax.imshow(mask.numpy(), cmap="Greens", vmin=0, vmax=1.4, aspect="auto", interpolation="nearest")
    n = seq_len // cp
    for r in range(1, cp):
        ax.axvline(r * n - 0.5, color="black", linewidth=0.8)
    ax.set_xticks([r * n + n / 2 - 0.5 for r in range(cp)])
    ax.set_xticklabels([f"keys of rank {r}" for r in range(cp)], fontsize=7)
    ax.set_yticks([0, n - 1])
    ax.set_yticklabels([f"pos {q_pos[0].item()}", f"pos {q_pos[-1].item()}"], fontsize=7)
    ax.set_title(f"rank {rank}'s mask after the all-gather"
                 + (f", documents {list(doc_lens)}" if doc_lens else ", causal"), fontsize=9)
    return ax


# --- pipeline figures ---
# Gantt charts of pipeline schedules (simulated or measured by --trace) and the bubble as a
# function of the number of micro-batches. NOTE for the pipeline chapter's owner: this
# section was rebuilt from tests/test_schedules.py and book/pipeline_parallel.md after the
# original was lost in an accidental overwrite of this file; compare it with your copy.
PIPELINE_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}


def _lighter(colour: str, amount: float):
    """`colour` mixed with white: amount 0 keeps it, 1 is white."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(colour))


def plot_schedule(schedule, t_f: float = 1.0, t_b: float = 2.0, t_w: float = 0.0, ax=None,
                  title=None):
    """A Gantt chart: one row per pipeline rank, one box per timed action, labelled with its
    micro-batch; F, B and W in three colours, later model chunks in lighter shades.

    `schedule`: per-rank action lists (`make_schedule`, timed here by `simulate` with t_f,
    t_b, t_w) or a `Timeline` (simulated, or measured: `timeline_from_events`). Actions of
    zero duration (W when t_w = 0) draw nothing. The title defaults to the bubble fraction.
    """
    from matplotlib.patches import Patch

    from .parallel.schedules import Timeline, simulate

    tl = schedule if isinstance(schedule, Timeline) else simulate(schedule, t_f, t_b, t_w)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, min(16.0, 0.4 * len(tl.events) / max(tl.n_ranks, 1))),
                                      0.55 * tl.n_ranks + 1.2))
    n_chunks = 1 + max((e.chunk for e in tl.events), default=0)
    for e in tl.events:
        if e.end <= e.start:
            continue
        shade = 0.55 * e.chunk / max(n_chunks - 1, 1)
        ax.add_patch(Rectangle((e.start, e.rank - 0.4), e.end - e.start, 0.8,
                               facecolor=_lighter(PIPELINE_COLOURS.get(e.kind, "#999999"), shade),
                               edgecolor="white", linewidth=0.8))
        ax.text((e.start + e.end) / 2, e.rank, str(e.microbatch), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, tl.makespan or 1)
    ax.set_ylim(tl.n_ranks - 0.5, -0.5)
    ax.set_yticks(range(tl.n_ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(tl.n_ranks)])
    ax.set_xlabel("time")
    kinds = [k for k in PIPELINE_COLOURS if any(e.kind == k and e.end > e.start for e in tl.events)]
    ax.legend(handles=[Patch(facecolor=PIPELINE_COLOURS[k], label=k) for k in kinds],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"bubble {tl.bubble_fraction:.1%}" if title is None else title, fontsize=9)
    return ax


def load_trace(paths) -> list[dict]:
    """Events of a `--trace` file, or of several: one JSON list of events, JSON lines, a JSON
    list of per-rank lists (the rank is the position), or one file per rank. Each event is a
    dict with rank, kind, microbatch, chunk, start, end."""
    import json
    import os
    from pathlib import Path

    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    events = []
    for i, path in enumerate(paths):
        text = Path(path).read_text().strip()
        try:
            data = json.loads(text)
            records = data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        if records and all(isinstance(r, list) for r in records):
            for rank, evs in enumerate(records):
                events += [e if "rank" in e else dict(e, rank=rank) for e in evs]
        else:
            events += [e if "rank" in e else dict(e, rank=i) for e in records]
    return events


def plot_trace(paths, ax=None, title=None):
    """The Gantt chart of a measured step (`python -m minipar.train ... --trace PATH`)."""
    from .parallel.schedules import timeline_from_events

    ax = plot_schedule(timeline_from_events(load_trace(paths)), ax=ax, title=title)
    ax.set_xlabel("time (s)")
    return ax


def plot_bubble_vs_microbatches(n_stages: int = 4, microbatches=range(1, 33), n_virtual: int = 2,
                                ax=None):
    """The bubble fraction of each schedule as the number of micro-batches m grows: afab and
    1F1B share (p-1)/(m+p-1), interleaving divides the slot by v, zero-bubble (with forward,
    input-gradient and weight-gradient passes equally long) by 3."""
    from .parallel.schedules import bubble_formula

    ms = list(microbatches)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    curves = [("afab", dict(), "-"), ("1f1b", dict(), "--"),
              (f"interleaved (v={n_virtual})", dict(n_virtual=n_virtual), "-"),
              ("zb (ZB-H1)", dict(t_f=1.0, t_b=1.0, t_w=1.0), "-")]
    for label, kw, style in curves:
        name = label.split()[0]
        ax.plot(ms, [bubble_formula(name, n_stages, m, **kw) for m in ms], style, label=label)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_title(f"p = {n_stages} stages", fontsize=9)
    ax.legend(fontsize=8)
    return ax


# --- 4D figures ---
def plot_rank_grid(tp: int = 2, cp: int = 2, pp: int = 2, dp: int = 2):
    """Which ranks share each group: one panel per axis, the same arrangement of ranks in
    each (a column per (cp, tp) pair, a row per (dp, pp) pair), ranks of one group in one
    colour. The arrangement is the grid's own `coords`, nothing recomputed here."""
    from .grid import AXES, ProcessGrid

    grid = ProcessGrid(tp, cp, pp, dp)
    fig, axes = plt.subplots(1, 4, figsize=(3.2 * 4, 3.4))
    palette = plt.get_cmap("tab20").colors
    for ax, axis in zip(axes, AXES):
        groups = grid.all_groups(axis)
        colour_of = {r: palette[i % len(palette)] for i, g in enumerate(groups) for r in g}
        for r in range(grid.world_size):
            c = grid.coords(r)
            x, y = c["tp"] + tp * c["cp"], c["pp"] + pp * c["dp"]
            ax.add_patch(Rectangle((x + 0.05, -y - 0.95), 0.9, 0.9, color=colour_of[r], alpha=0.85))
            ax.text(x + 0.5, -y - 0.5, str(r), ha="center", va="center", fontsize=10, color="white",
                    weight="bold")
        ax.set_xlim(0, tp * cp)
        ax.set_ylim(-pp * dp, 0)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{AXIS_NAMES[axis]}: {len(groups)} groups of {len(groups[0])}", fontsize=10)
    fig.suptitle(f"{grid.world_size} ranks, tp={tp} cp={cp} pp={pp} dp={dp}: "
                 "columns (cp, tp), rows (dp, pp); one colour per group", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


# --- failures figures ---
FAILURE_CATEGORY_COLORS = {"GPU": "#C44E52", "Dependency": "#8172B2", "Network": "#4C72B0",
                           "Unplanned Maintenance": "#937860", "Host": "#55A868",
                           "Unknown": "#8C8C8C"}


def plot_interruptions(rows, ax=None):
    """Interruptions per root cause, from (component, category, count, percent) rows: bars
    of the counts coloured by category, each labelled with the printed percentage and the
    percentage its count implies."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 5))
    total = sum(r[2] for r in rows)
    names = [r[0] for r in rows][::-1]
    counts = [r[2] for r in rows][::-1]
    colors = [FAILURE_CATEGORY_COLORS.get(r[1], "grey") for r in rows][::-1]
    ax.barh(names, counts, color=colors)
    for y, (count, pct) in enumerate(zip(counts, [r[3] for r in rows][::-1])):
        implied = 100 * count / total
        flag = "  <- printed != count" if abs(implied - pct) > 0.05 else ""
        ax.text(count + 2, y, f"{count}: {pct}% printed, {implied:.1f}% of {total}{flag}",
                va="center", fontsize=7)
    for cat, color in FAILURE_CATEGORY_COLORS.items():
        ax.barh([names[0]], [0], color=color, label=cat)
    ax.set_xlim(0, max(counts) * 1.9)
    ax.set_xlabel("unexpected interruptions in 54 days")
    ax.legend(fontsize=7, loc="lower right", title="category", title_fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    return ax


def plot_checkpoint_waste(intervals_s, waste: dict, optima: dict, ax=None):
    """Fraction of time lost against the checkpoint interval, one curve per write time;
    `optima` marks each curve's best interval (label -> interval in seconds)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    minutes = [t / 60 for t in intervals_s]
    for k, (label, w) in enumerate(waste.items()):
        line, = ax.plot(minutes, [100 * x for x in w], label=label)
        best = optima[label]
        i = min(range(len(intervals_s)), key=lambda j: abs(intervals_s[j] - best))
        ax.plot([best / 60], [100 * w[i]], "o", color=line.get_color())
        ax.annotate(f"{best / 60:.0f} min", (best / 60, 100 * w[i]), textcoords="offset points",
                    xytext=(4, 6), fontsize=8, color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("time lost (%)")
    ax.set_ylim(0, 60)
    ax.legend(fontsize=8)
    return ax


def plot_restart_curves(curves: dict, events: dict | None = None, ax=None):
    """Loss curves given as label -> (steps, losses); the first is drawn wide underneath so
    that coinciding curves show as coinciding. `events`: label -> step, drawn as vertical
    lines (a failure, a resume)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    markers = "os^vD"
    for k, (label, (steps, losses)) in enumerate(curves.items()):
        if k == 0:
            ax.plot(steps, losses, color="lightgrey", linewidth=6, label=label, zorder=1)
        else:
            ax.plot(steps, losses, marker=markers[k % len(markers)], markersize=4, linewidth=1,
                    label=label, zorder=2)
    for k, (label, step) in enumerate((events or {}).items()):
        ax.axvline(step, color="black", linestyle=[":", "--", "-."][k % 3], linewidth=1, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return ax
# --- end of failures figures ---
