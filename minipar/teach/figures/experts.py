"""Figures of the experts chapter: where a router sends tokens, what expert parallelism
sends for them, and DeepSeek-V3's layout on its cluster.

Chapter "Experts: the fifth axis". The routing comes from a real training run of the tiny
mixture of experts (`numbers.experts.routing_loads`); the bytes from
`formulas.experts.dispatch_bytes` against `formulas.tensor_parallel.tp_layer_bytes` and the
cost model's `nic_copies`; the layout from the report's numbers (the `deepseek-v3` preset's
published layout).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ...plan.config import ModelConfig
from ...plan.costmodel.defaults import PRESET_LAYOUTS
from ...plan.costmodel.experts import nic_copies
from ..numbers.experts import (BIAS_RATE, PRESET, imbalance, layer_bytes, routing_loads)
from ..style import BLUE, BROWN, GREY, ORANGE, PAGE_WIDTH, PURPLE, log2_ticks

EP_COLOR, TP_COLOR = BROWN, BLUE
DEGREES = [2, 4, 8, 16, 32, 64]


def plot_routing(steps: int | None = None):
    """Left: the load of each expert of each layer at the last step of the run without
    balancing, over the mean. Right: the busiest expert's load over the mean (the
    imbalance), averaged over the layers, step by step, without and with the bias."""
    off = routing_loads(0.0) if steps is None else routing_loads(0.0, steps)
    on = routing_loads(BIAS_RATE) if steps is None else routing_loads(BIAS_RATE, steps)
    fig, (left, right) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.0),
                                      gridspec_kw={"width_ratios": [1, 1.3]})
    last = off[-1]
    grid = [[n / (sum(layer) / len(layer)) for n in layer] for layer in last]
    image = left.imshow(grid, cmap="RdBu_r", vmin=0, vmax=2, aspect="auto")
    for i, row in enumerate(grid):
        for e, v in enumerate(row):
            left.text(e, i, f"{v:.1f}", ha="center", va="center", fontsize=7)
    left.set_xticks(range(len(last[0])))
    left.set_yticks(range(len(last)))
    left.set_xlabel("expert")
    left.set_ylabel("layer")
    left.set_title(f"load / mean, step {len(off) - 1}, no balancing", fontsize=9)
    fig.colorbar(image, ax=left, fraction=0.06, pad=0.03)
    for loads, label, colour in ((off, "no balancing", GREY),
                                 (on, f"bias balancing, rate {BIAS_RATE:g}", EP_COLOR)):
        mean = [sum(imbalance(layer) for layer in step) / len(step) for step in loads]
        right.plot(range(len(loads)), mean, color=colour, label=label, linewidth=1.5)
    right.axhline(1.0, color="black", linestyle=":", linewidth=1)
    right.set_xlabel("training step")
    right.set_ylabel("busiest expert / mean")
    right.set_title("imbalance, mean over the layers", fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_layer_bytes(tokens: int | None = None, ax=None):
    """MB one GPU sends per MoE layer and micro-batch (forward and backward) at DeepSeek-V3's
    shapes: expert parallelism's all-to-alls (bf16, and with the dispatch in FP8) against
    tensor parallelism's all-reduces at the same degree."""
    m = ModelConfig.preset(PRESET)
    tokens = tokens or PRESET_LAYOUTS[PRESET]["seq_len"]
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH / 2, 3.0))
    for label, key, fp8, colour, style in (
            (f"EP, top-{m.moe_top_k}, bf16", "ep", None, EP_COLOR, "-"),
            ("EP, FP8 dispatch", "ep", 1, ORANGE, "--"),
            ("TP (with or without SP)", "tp", None, TP_COLOR, "-")):
        mb = [layer_bytes(tokens, m, n, dispatch_act_bytes=fp8)[key] / 1e6 for n in DEGREES]
        ax.plot(DEGREES, mb, style, color=colour, marker="o", markersize=3, label=label)
    log2_ticks(ax, DEGREES, "degree (EP or TP)")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("MB per GPU per layer")
    ax.set_title(f"one layer, {tokens:,} tokens, d = {m.dim:,}", fontsize=9)
    ax.legend(fontsize=7, loc="center right")
    return ax


def plot_nic_copies(top_k: int = 8, max_nodes: int = 4, ax=None):
    """Copies of one token that cross the network (leave its server) against the servers an
    EP group spans, uniform routing: each of its top_k copies on its own, or DeepSeek-V3's
    node-limited routing (at most `max_nodes` servers, one copy per server)."""
    servers = [1, 2, 4, 8, 16, 32]
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_WIDTH / 2, 3.0))
    ax.plot(servers, [nic_copies(top_k, s, 0) for s in servers], color=EP_COLOR, marker="o",
            markersize=3, label=f"each of the {top_k} copies on its own")
    ax.plot(servers, [nic_copies(top_k, s, max_nodes) for s in servers], color=PURPLE, marker="o",
            markersize=3, label=f"at most {max_nodes} servers, one copy each")
    log2_ticks(ax, servers, "servers the EP group spans")
    ax.set_ylim(0, top_k)
    ax.set_ylabel("copies per token on the NIC")
    ax.set_title("what crosses the network", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def plot_ep_bytes():
    """`plot_layer_bytes` and `plot_nic_copies` side by side."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.0))
    plot_layer_bytes(ax=left)
    m = ModelConfig.preset(PRESET)
    plot_nic_copies(m.moe_top_k, m.moe_max_nodes, ax=right)
    fig.tight_layout()
    return fig


def _server(ax, x, y, colour, label=""):
    ax.add_patch(Rectangle((x + 0.06, y + 0.1), 0.88, 0.8, facecolor=colour, edgecolor="white"))
    if label:
        ax.text(x + 0.5, y + 0.5, label, ha="center", va="center", fontsize=7, color="white")


def plot_dsv3_layout():
    """DeepSeek-V3's 2,048 GPUs as servers of 8: one row per pipeline stage (PP16), each
    stage's servers split into EP groups of EP64 (8 servers), the groups of a stage holding
    the same experts (expert data parallelism). Which servers hold which stage is drawn in
    order: the report does not say."""
    lay = PRESET_LAYOUTS[PRESET]
    per_node = 8
    per_stage = lay["dp"] // per_node                  # servers per stage
    group = lay["ep"] // per_node                      # servers per EP group
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 4.6))
    colours = (EP_COLOR, ORANGE)
    for stage in range(lay["pp"]):
        for s in range(per_stage):
            g = s // group
            _server(ax, s, stage, colours[g % 2], str(stage * per_stage + s) if stage == 0 else "")
        ax.text(-0.2, stage + 0.5, f"stage {stage}", ha="right", va="center", fontsize=7)
    for g in range(per_stage // group):
        ax.annotate("", xy=(g * group + 0.05, -0.25), xytext=(g * group + group - 0.05, -0.25),
                    arrowprops=dict(arrowstyle="<->", linewidth=1))
        ax.text(g * group + group / 2, -0.45, f"EP group {g}: {lay['ep']} GPUs, {group} servers, "
                f"{ModelConfig.preset(PRESET).moe_experts // lay['ep']} experts per GPU",
                ha="center", va="bottom", fontsize=7)
    ax.set_xlim(-2.2, per_stage + 0.1)
    ax.set_ylim(lay["pp"] + 0.1, -1.3)
    ax.axis("off")
    ax.set_title(f"{lay['pp'] * lay['dp']:,} H800s in servers of {per_node}: PP{lay['pp']}, one "
                 f"row per stage; DP{lay['dp']} across, EP{lay['ep']} carved from it\nthe EP "
                 "groups of a stage hold the same experts: expert data parallelism, ZeRO-1 "
                 "over them", fontsize=8)
    fig.tight_layout()
    return fig
