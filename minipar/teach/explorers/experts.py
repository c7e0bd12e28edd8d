"""The experts chapter's explorer (book/experts.md): an expert-parallel layout at DeepSeek-V3's
shapes, by EP degree, top-k, the busiest expert's load, node-limited routing, the number of
experts and the dispatch's precision: bytes per GPU against TP's, what crosses the network,
and how much longer the busiest EP rank computes.

Chapter "Experts: the fifth axis". Everything comes from the chapter's functions: the bytes
from `formulas.experts.dispatch_bytes` and `formulas.tensor_parallel.tp_layer_bytes`
(`numbers.experts.layer_bytes`), the copies on the NIC from `costmodel.experts.nic_copies`,
the busiest rank from `costmodel.experts.busiest_rank_load`. The page shows DeepSeek-V3's
own setting: EP64 over 8 servers, top-8 of 256, at most 4 servers per token.
"""
from __future__ import annotations

import dataclasses
import textwrap

import matplotlib.pyplot as plt

from ...plan.config import ModelConfig
from ...plan.costmodel.experts import busiest_rank_load, nic_copies
from ..figures.experts import DEGREES, EP_COLOR, TP_COLOR
from ..numbers.experts import PRESET, layer_bytes
from ..style import INVALID, ORANGE, PAGE_WIDTH, PURPLE, log2_ticks
from ..widgets import choice, explorer, steps

GPUS_PER_SERVER = 8
TOKENS = 4096                  # one micro-batch of DeepSeek-V3's pre-training: one 4K sequence
IMBALANCES = [1.0, 1.5, 2.0, 3.0, 4.0]
DEFAULTS = dict(ep=64, top_k=8, imbalance=1.0, max_nodes=4, experts=256, dispatch="fp8")


def _model(kw) -> ModelConfig:
    return dataclasses.replace(ModelConfig.preset(PRESET), moe_experts=kw["experts"],
                               moe_top_k=kw["top_k"], moe_max_nodes=kw["max_nodes"])


def problem(kw) -> str | None:
    """Why the setting cannot run (the rules of --ep, --moe-top-k and --moe-imbalance)."""
    e, k, ep = kw["experts"], kw["top_k"], kw["ep"]
    if k > e:
        return f"top-{k} of {e} experts: a token picks k different experts"
    if e % ep:
        return f"EP{ep} does not divide {e} experts: every EP rank holds E / ep of them"
    if kw["imbalance"] > e / k:
        return (f"a busiest expert at {kw['imbalance']:g}x the mean is more than every token "
                f"(at most E / k = {e / k:g}x)")
    return None


def _draw_bytes(ax, kw, m):
    fp8 = 1 if kw["dispatch"] == "fp8" else None
    ep = [layer_bytes(TOKENS, m, n, dispatch_act_bytes=fp8)["ep"] / 1e6 for n in DEGREES]
    tp = [layer_bytes(TOKENS, m, n)["tp"] / 1e6 for n in DEGREES]
    ax.plot(DEGREES, ep, color=EP_COLOR, marker="o", markersize=3,
            label=f"EP all-to-alls, top-{kw['top_k']}, {kw['dispatch']} dispatch")
    ax.plot(DEGREES, tp, color=TP_COLOR, marker="o", markersize=3, label="TP all-reduces")
    ax.axvline(kw["ep"], color="grey", linestyle=":")
    log2_ticks(ax, DEGREES, "degree")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("MB per GPU per layer")
    ax.set_title(f"one layer, {TOKENS:,} tokens, fwd + bwd", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")


def _draw_nic(ax, kw):
    servers = [1, 2, 4, 8]
    k = kw["top_k"]
    ax.plot(servers, [nic_copies(k, s, 0) for s in servers], color=EP_COLOR, marker="o",
            markersize=3, label="no server limit")
    if kw["max_nodes"]:
        ax.plot(servers, [nic_copies(k, s, kw["max_nodes"]) for s in servers], color=PURPLE,
                marker="o", markersize=3, label=f"at most {kw['max_nodes']} servers")
    ax.axvline(max(1, kw["ep"] // GPUS_PER_SERVER), color="grey", linestyle=":")
    log2_ticks(ax, servers, "servers per EP group")
    ax.set_ylim(0, max(1, k))
    ax.set_ylabel("copies per token on the NIC")
    ax.set_title("what crosses the network", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def _draw_load(ax, kw):
    e = kw["experts"]
    most = e / kw["top_k"]
    shown = [i for i in IMBALANCES if i <= most]
    for n, colour in ((8, ORANGE), (kw["ep"], EP_COLOR), (e, PURPLE)):
        if e % n == 0 and n <= e:
            ax.plot(shown, [busiest_rank_load(e, n, i) for i in shown], color=colour, marker="o",
                    markersize=3, label=f"EP{n}: {e // n} experts per rank",
                    linewidth=2.5 if n == kw["ep"] else 1)
    ax.axvline(kw["imbalance"], color="grey", linestyle=":")
    ax.set_xlabel("busiest expert / mean")
    ax.set_ylabel("busiest EP rank / mean")
    ax.set_title("what a hot expert costs", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def figure(**values):
    """Bytes per GPU per layer against the degree, copies on the NIC against the servers an
    EP group spans, and the busiest rank's load against the busiest expert's. Pure."""
    kw = {**DEFAULTS, **values}
    m = _model(kw)
    fig = plt.figure(figsize=(PAGE_WIDTH, 6.2))
    grid = fig.add_gridspec(2, 2)
    _draw_bytes(fig.add_subplot(grid[0, :]), kw, m)
    _draw_nic(fig.add_subplot(grid[1, 0]), kw)
    _draw_load(fig.add_subplot(grid[1, 1]), kw)
    head = (f"DeepSeek-V3's shapes, EP{kw['ep']}, top-{kw['top_k']} of {kw['experts']}, "
            f"busiest expert {kw['imbalance']:g}x the mean")
    why = problem(kw)
    if why:
        text = f"refused: {why}"
    else:
        fp8 = 1 if kw["dispatch"] == "fp8" else None
        mb = layer_bytes(TOKENS, m, kw["ep"], dispatch_act_bytes=fp8)["ep"] / 1e6
        load = busiest_rank_load(kw["experts"], kw["ep"], kw["imbalance"])
        text = (f"{mb:,.0f} MB per GPU per layer; the busiest rank computes {load:.2f}x the "
                "mean rank's tokens, and every rank waits for it")
    fig.suptitle(head + "\n" + textwrap.fill(text, 95), fontsize=9,
                 color=INVALID if why else "black")
    fig.tight_layout()
    return fig


CONTROLS = {"ep": steps(DEGREES), "top_k": steps([1, 2, 4, 8], "top-k"),
            "imbalance": steps(IMBALANCES, "hot expert"),
            "max_nodes": steps([0, 1, 2, 4, 8], "max servers"),
            "experts": steps([8, 64, 256]), "dispatch": choice(["fp8", "bf16"])}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every EP degree,
# each with every value of the other controls one at a time.
WEB = {"ep": list(CONTROLS["ep"].values)}
ALONE = {name: list(CONTROLS[name].values)
         for name in ("top_k", "imbalance", "max_nodes", "experts", "dispatch")}


def explore(**defaults):
    """Sliders for EP, top-k, the hot expert, the server limit, the experts, the dispatch."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
