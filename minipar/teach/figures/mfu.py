"""Figures of the MFU chapter: the cost model against Llama 3's Table 4, and why.

Published vs predicted MFU for the three rows of Table 4, the bytes and the seconds each
axis puts on the wire, the memory of the most loaded GPU, the network hierarchy each axis's
groups span, how tightly Table 4 pins the two compute constants, and a tiny measured run
against the model's prediction. Every number comes from `minipar.costmodel`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ...plan.config import ModelConfig
from ...plan.costmodel import LLAMA3_CLUSTER, TABLE4, table4, wire_seconds
from ...plan.costmodel.band import mfu_band
from ...plan.costmodel.constants import NIC_BUSBW_FRACTION
from ...plan.costmodel.table4 import TOLERANCE, nic_sensitivity, nic_window
from ...plan.flops import attention_flops_per_token, dense_flops_per_token
from .. import replays
from ..style import AXES, AXIS_NAMES, BLUE, COLORS, GREEN, ORANGE, PAGE_WIDTH, stacked_bars


def table4_figure(results=None):
    """Published vs predicted MFU for the three rows of Llama 3's Table 4: each prediction to
    the whole percent with its band (`costmodel.band.mfu_band`, the llama3 stack's) as an
    error bar, and the +-TOLERANCE points around each published value. `results`:
    `costmodel.table4()` (computed if None)."""
    results = results if results is not None else table4()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = range(len(results))
    published = [100 * row.mfu for row, _ in results]
    predicted = [100 * est.mfu for _, est in results]
    bands = [mfu_band(est.mfu, "llama3") for _, est in results]
    ax.bar([x - 0.2 for x in xs], published, 0.4, label="published (Llama 3, Table 4)",
           color=COLORS["reference"])
    ax.bar([x + 0.2 for x in xs], predicted, 0.4, label="predicted (minipar.costmodel), with its band",
           color=COLORS["compute"])
    ax.errorbar([x + 0.2 for x in xs], predicted, fmt="none", ecolor="black", capsize=4, lw=1,
                yerr=[[q - 100 * lo for q, (lo, _) in zip(predicted, bands)],
                      [100 * hi - q for q, (_, hi) in zip(predicted, bands)]])
    for x, p, q, (_, hi) in zip(xs, published, predicted, bands):
        ax.add_patch(Rectangle((x - 0.42, p - TOLERANCE), 0.84, 2 * TOLERANCE, fill=False, ls=":",
                               ec="black", lw=0.8))
        ax.text(x - 0.2, p + 0.4, f"{p:.0f}", ha="center", fontsize=9)
        ax.text(x + 0.2, 100 * hi + 0.6, f"{q:.0f}", ha="center", fontsize=9)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{row.gpus:,} GPUs\nTP{row.tp} CP{row.cp} PP{row.pp} DP{row.dp}\nseq {row.seq_len:,}"
                        for row, _ in results], fontsize=8)
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(0, 60)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"Llama 3 405B: one set of constants, three rows (dotted: ±{TOLERANCE:g} points)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def nic_sensitivity_figure(sweep=None):
    """Table 4's rows predicted at each bus bandwidth across servers (a fraction of the NIC's
    line rate), against the published MFU and its +-TOLERANCE band: where the measured
    constant sits, and the window in which the two NIC-bound rows would both agree.
    `sweep`: `costmodel.table4.nic_sensitivity()` (computed if None)."""
    sweep = sweep if sweep is not None else nic_sensitivity()
    window = nic_window(sweep)
    xs = [100 * f for f in sweep]
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.6))
    for i, (row, colour) in enumerate(zip(TABLE4, (BLUE, ORANGE, GREEN))):
        label = f"row {i + 1}: {row.gpus:,} GPUs, DP{row.dp}, seq {row.seq_len:,}"
        ax.plot(xs, [100 * mfus[i] for mfus in sweep.values()], color=colour, lw=2, label=label)
        ax.axhspan(100 * row.mfu - TOLERANCE, 100 * row.mfu + TOLERANCE, color=colour, alpha=0.08)
        ax.axhline(100 * row.mfu, color=colour, ls="--", lw=0.8)
    if window:
        ax.axvspan(100 * window[0], 100 * window[1], color=COLORS["reference"], alpha=0.25,
                   label=f"rows 1 and 2 both within {TOLERANCE:g} points")
    ax.axvline(100 * NIC_BUSBW_FRACTION, color="black", lw=1)
    ax.annotate("the model: nccl-tests\non InfiniBand", (100 * NIC_BUSBW_FRACTION, 32),
                xytext=(-6, 0), textcoords="offset points", ha="right", fontsize=8)
    ax.set_xlabel("bus bandwidth across servers (% of the NIC's 400 Gb/s)")
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(30, 52)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"Table 4 against the fabric's bus bandwidth (dashed: published, band: ±{TOLERANCE:g})",
                 fontsize=10)
    fig.tight_layout()
    return fig


def comm_volume_figure(estimates: dict, cluster=None):
    """Bytes each GPU sends per step, stacked by axis (left), and the seconds those bytes
    take on their links (right): bytes are not time, TP's are many but travel on NVLink.
    `estimates`: {label: Estimate}."""
    cluster = cluster or LLAMA3_CLUSTER
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.4))
    labels, es = list(estimates), list(estimates.values())
    stacked_bars(ax, {a: [e.comm_bytes_per_gpu[a] / 1e9 for e in es] for a in AXES}, AXIS_NAMES)
    stacked_bars(bx, {a: [wire_seconds(e, a, cluster) for e in es] for a in AXES}, AXIS_NAMES)
    for a, title, unit in ((ax, "bytes sent per GPU per step", "GB"),
                           (bx, "time on the wire (not all exposed)", "s")):
        a.set_xticks(range(len(labels)))
        a.set_xticklabels(labels, fontsize=8)
        a.set_ylabel(unit)
        a.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def memory_figure(estimates: dict, hbm_gb: float = 80.0):
    """Memory of the most loaded GPU, stacked: parameters, gradients, optimizer state,
    activations; the dashed line is the HBM. `estimates`: {label: Estimate}."""
    fig, ax = plt.subplots(figsize=(min(PAGE_WIDTH, max(5, 1.3 * len(estimates) + 2)), 3.6))
    es = list(estimates.values())
    parts = list(es[0].memory_breakdown_gb) if es else []
    totals = stacked_bars(ax, {p: [e.memory_breakdown_gb[p] for e in es] for p in parts})
    for i, total in enumerate(totals):      # inside the bar's top: clear of the HBM line
        ax.text(i, total - 1.5, f"{total:.0f}", ha="center", va="top", fontsize=8,
                color="white", weight="bold", zorder=3,
                bbox=dict(facecolor=COLORS["activations"], edgecolor="none", pad=1))
    ax.axhline(hbm_gb, ls="--", color="black", lw=1)
    ax.text(1.01, hbm_gb, f"HBM\n{hbm_gb:g} GB", va="center", fontsize=8,
            transform=ax.get_yaxis_transform())
    ax.set_xticks(range(len(estimates)))
    ax.set_xticklabels(list(estimates), fontsize=8)
    ax.set_ylabel("GB per GPU")
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=4, frameon=False)
    ax.set_title("memory of the most loaded GPU", fontsize=9)
    fig.tight_layout()
    return fig


def network_levels(cluster) -> list[tuple]:
    """(name, first GPU, last GPU, link, background colour) of each level of the network."""
    return [
        ("server", 1, cluster.gpus_per_node, f"NVLink {cluster.intra_node_GBps:g} GB/s", "#DCE9F5"),
        ("rack", cluster.gpus_per_node, cluster.gpus_per_rack, "ToR switch", "#E6F2E1"),
        ("pod", cluster.gpus_per_rack, cluster.pod_size,
         f"RoCE {cluster.inter_node_Gbps:g} Gb/s, full bisection", "#F7E6D6"),
        ("cluster", cluster.pod_size, cluster.n_gpus,
         f"1:{cluster.pod_oversubscription:g} between pods", "#EEE0EE"),
    ]


def network_figure(parallel=None, cluster=None):
    """The network hierarchy (server -> rack -> pod -> cluster) on a log scale of GPUs, with
    the range of GPUs each parallel axis's groups cover under the [TP, CP, PP, DP] order."""
    cluster = cluster or LLAMA3_CLUSTER
    pc = parallel or TABLE4[2].parallel()
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.8))
    ax.set_xscale("log", base=2)
    for name, lo, hi, link, color in network_levels(cluster):
        ax.axvspan(lo, hi, color=color, zorder=0)
        ax.text((lo * hi) ** 0.5, 4.55, f"{name}\n(up to {hi:,})", ha="center", va="center", fontsize=8)
        ax.text((lo * hi) ** 0.5, -0.75, link, ha="center", va="center", fontsize=7)
    spans = [("tp", 1, pc.tp), ("cp", pc.tp, pc.tp * pc.cp), ("pp", pc.tp * pc.cp, pc.tp * pc.cp * pc.pp),
             ("dp", pc.tp * pc.cp * pc.pp, pc.world_size)]
    for y, (axis, lo, hi) in zip((3.3, 2.4, 1.5, 0.6), spans):
        if hi > lo:
            ax.barh(y, hi - lo, left=lo, height=0.55, color=COLORS[axis])
        ax.text(hi * 1.08 if hi > lo else lo * 1.08, y,
                f"{AXIS_NAMES[axis]} = {hi // lo}" + ("" if hi > lo else " (unused)"),
                va="center", fontsize=8)
    ax.set_xlim(1, cluster.n_gpus * 1.05)
    ax.set_ylim(-1.2, 5.2)
    ax.set_yticks([])
    ax.set_xlabel("GPUs spanned by one group (log scale)")
    ax.set_title(f"where each axis sits: TP{pc.tp} CP{pc.cp} PP{pc.pp} DP{pc.dp} on {pc.world_size:,} GPUs",
                 fontsize=9)
    fig.tight_layout()
    return fig


def measured_vs_predicted_figure(measured: dict, predicted: dict, title: str = ""):
    """Wire bytes per axis as CommLog measured them (rank 0) next to the cost model's
    prediction. measured: {axis: {op: {"wire_bytes": ...}}} (the `comm` of --log-json);
    predicted: {axis: bytes} (`costmodel.comm_bytes_per_gpu`)."""
    axes = [a for a in AXES if predicted.get(a) or measured.get(a)]
    got = [sum(op["wire_bytes"] for op in measured.get(a, {}).values()) / 1e3 for a in axes]
    want = [predicted.get(a, 0) / 1e3 for a in axes]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = range(len(axes))
    ax.bar([x - 0.2 for x in xs], got, 0.4, label="measured (CommLog)", color=COLORS["reference"])
    ax.bar([x + 0.2 for x in xs], want, 0.4, label="predicted (cost model)",
           color=[COLORS[a] for a in axes])
    ax.set_xticks(list(xs))
    ax.set_xticklabels([AXIS_NAMES[a] for a in axes], fontsize=8)
    ax.set_ylabel("kB sent by rank 0 per step")
    ax.legend(fontsize=8)
    ax.set_title(title or "tiny gloo run: measured vs predicted", fontsize=10)
    fig.tight_layout()
    return fig


def flops_per_token_figure(model_name: str = "llama3-405b", seq_lens=(2048, 8192, 32768, 131072)):
    """Model FLOPs per token of a training step (PaLM's convention), stacked: the weight
    matmuls 6N, the same at every length, and attention's 12 L h s, which grows with it."""
    m = ModelConfig.preset(model_name)
    dense = [dense_flops_per_token(m) / 1e12] * len(seq_lens)
    attention = [attention_flops_per_token(m, s) / 1e12 for s in seq_lens]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    xs = range(len(seq_lens))
    ax.bar(xs, dense, color=COLORS["compute"], label="6N: weight matmuls")
    ax.bar(xs, attention, bottom=dense, color=COLORS["cp"], label="12 L h s: attention scores")
    for x, d, a in zip(xs, dense, attention):
        ax.text(x, d + a, f"{100 * a / (d + a):.0f}% attention", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"s = {s:,}" for s in seq_lens], fontsize=8)
    ax.set_ylabel("TFLOP per token")
    ax.set_ylim(0, 1.15 * (dense[-1] + attention[-1]))
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"{m.name}: FLOPs per token of a training step", fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ Llama 3, replayed
def plot_llama3_replayed_mfu():
    """The MFU of Table 4's first row four ways: published; replayed on H100s from the
    program of 32 gloo ranks (`teach.replays`, run "llama3"); the cost model told the same
    program (its gradients reduced in per-layer units); and the cost model's prediction of
    the row under Llama 3's stack (`costmodel.table4`: balanced stages; nothing fitted). The
    three that run the cost model's physics carry the llama3 stack's band."""
    bars = {"published\n(Table 4)": (TABLE4[0].mfu, COLORS["reference"]),
            "replayed\n(this program)": (replays.replayed("llama3").mfu, COLORS["pp"]),
            "cost model,\nthis program": (replays.estimated("llama3").mfu, COLORS["compute"]),
            "cost model,\nLlama 3's stack": (table4()[0][1].mfu, COLORS["tp time"])}
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH - 1.5, 2.8))
    for x, (label, (mfu, colour)) in enumerate(bars.items()):
        ax.bar(x, 100 * mfu, 0.6, color=colour)
        top = mfu
        if x > 0:
            low, top = mfu_band(mfu, "llama3")
            ax.errorbar([x], [100 * mfu], yerr=[[100 * (mfu - low)], [100 * (top - mfu)]],
                        fmt="none", ecolor="black", capsize=4, lw=1)
        ax.text(x, 100 * top + 0.8, f"{mfu:.0%}", ha="center", fontsize=8)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(list(bars), fontsize=8)
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(0, 65)
    ax.set_title("Llama 3 405B, TP8 CP1 PP16 DP64 on 8,192 H100s (bars: the band)", fontsize=9)
    fig.tight_layout()
    return fig
