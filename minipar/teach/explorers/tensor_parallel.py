"""The tensor-parallel chapter's explorer (book/tensor_parallel.md): what one layer's TP
collectives cost as t and the link change.

Bytes come from `formulas.tp_layer_bytes` (four all-reduces of the [b, s, h] activation
per layer and micro-batch, or SP's all-gathers and reduce-scatters: the same bytes), the
time from the link's rate at the cost model's fitted fraction of it, and the layer's compute
from 6 N_layer + 12 h s FLOPs per token at a stated throughput. `figure` draws Llama 3
405B's layer (the page shows that), `explore` puts sliders on it. The links are the data sheets' (`plan.datasheets`, the one
table the cost model wires its clusters from): an H100's NVLink, 450 GB/s each way, by
default, the chapter's, and its 400 Gb/s NIC; the slider offers every link of that table.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import ModelConfig
from ...plan.costmodel.constants import LLAMA3_EFFICIENCY
from ...plan.datasheets import H100, SHEETS
from ...plan.flops import layer_param_count
from ...plan.formulas.tensor_parallel import tp_layer_bytes
from ..style import COLORS, PAGE_WIDTH
from ..widgets import choice, explorer, powers, slider, steps

NIC_GBps = H100.nic_Gbps / 8     # one 400 Gb/s NIC, 50 GB/s: the link TP would use across servers
# Every link of the data sheets, GB/s per GPU and direction: NVLink inside a server, the NIC
# across servers (Gb/s / 8)
LINKS = tuple(sorted({s.nvlink_GBps for s in SHEETS.values() if s.nvlink_GBps}
                     | {s.nic_Gbps / 8 for s in SHEETS.values() if s.nic_Gbps}))
DEFAULTS = dict(t=8, link_GBps=H100.nvlink_GBps, seq_len=8192, microbatch=1, tflops=430.0,
                model="llama3-405b", act_bytes=2)
TPS = (1, 2, 4, 8, 16, 32, 64)


def layer_costs(t: int, link_GBps: float, seq_len: int, microbatch: int, tflops: float,
                model: str, act_bytes: int, efficiency: float = LLAMA3_EFFICIENCY.network) -> dict:
    """One layer and micro-batch on one of t GPUs: TP bytes sent, their time on the link at
    `efficiency` of its rate (the cost model's fitted NVLink fraction by default; its NIC
    fraction for the network line), and the layer's compute time."""
    m = ModelConfig.preset(model)
    tokens = seq_len * microbatch
    sent = tp_layer_bytes(tokens, m.dim, t, act_bytes)
    flops = (6 * layer_param_count(m) + 12 * m.dim * seq_len) * tokens / t
    return {"bytes": sent, "comm_s": sent / (link_GBps * 1e9 * efficiency),
            "compute_s": flops / (tflops * 1e12)}


def figure(**values):
    """Left: bytes one GPU sends per layer and micro-batch against t. Right: their time on
    the chosen link and on a 50 GB/s NIC, against the layer's compute on one of t GPUs."""
    kw = {**DEFAULTS, **values}
    rest = {k: kw[k] for k in ("seq_len", "microbatch", "tflops", "model", "act_bytes")}
    fig, (left, right) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.6))
    on_link = [layer_costs(t, kw["link_GBps"], **rest) for t in TPS]
    on_nic = [layer_costs(t, NIC_GBps, **rest, efficiency=LLAMA3_EFFICIENCY.network_inter) for t in TPS]
    left.plot(TPS, [c["bytes"] / 1e9 for c in on_link], "o-", color=COLORS["tp"])
    left.set_ylabel("GB sent per GPU, one layer", fontsize=8)
    right.plot(TPS, [c["comm_s"] * 1e3 for c in on_link], "o-", color=COLORS["tp"],
               label=f"TP collectives on {kw['link_GBps']:g} GB/s")
    right.plot(TPS, [c["comm_s"] * 1e3 for c in on_nic], "s--", color=COLORS["pp"],
               label=f"TP collectives on a {NIC_GBps:g} GB/s NIC")
    right.plot(TPS, [c["compute_s"] * 1e3 for c in on_link], "^-", color=COLORS["reference"],
               label=f"the layer's compute at {kw['tflops']:g} TFLOP/s")
    right.set_yscale("log")
    right.set_ylabel("ms per layer and micro-batch", fontsize=8)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(TPS)
        ax.set_xticklabels([str(t) for t in TPS])
        ax.axvline(kw["t"], color="grey", linestyle=":")
        ax.set_xlabel("tensor-parallel degree t", fontsize=8)
    c = layer_costs(kw["t"], kw["link_GBps"], **rest)
    fig.suptitle(f"{kw['model']}, {kw['microbatch']} x {kw['seq_len']:,} tokens, t = {kw['t']}: "
                 f"{c['bytes'] / 1e9:.2f} GB per layer,\n{c['comm_s'] * 1e3:.1f} ms on the link "
                 f"vs {c['compute_s'] * 1e3:.1f} ms of compute ({c['comm_s'] / c['compute_s']:.0%})",
                 fontsize=9)
    fig.tight_layout()
    return fig


CONTROLS = {"t": steps(TPS), "link_GBps": steps(LINKS, "link GB/s"),
            "model": choice(["llama3-405b", "llama3-70b", "llama3-8b"]),
            "seq_len": powers(10, 17, "seq len"), "microbatch": slider(1, 8, label="micro-batch"),
            "tflops": slider(100.0, 900.0, 10.0, "TFLOP/s")}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every t, each
# with every model, every link of the data sheets, every sequence, and the sliders' ends,
# defaults and values between, one at a time.
WEB = {"t": list(TPS)}
ALONE = {"model": list(CONTROLS["model"].values), "seq_len": list(CONTROLS["seq_len"].values),
         "link_GBps": list(LINKS),
         "microbatch": sorted({1, 2, DEFAULTS["microbatch"], 4, 8}),
         "tflops": sorted({100.0, 200.0, DEFAULTS["tflops"], 600.0, 900.0})}


def explore(**defaults):
    """Sliders for t, the link, the sequence, the micro-batch and the throughput."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
