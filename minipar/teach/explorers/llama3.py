"""The case-study chapter's explorer (book/llama3.md): a layout of Llama 3 405B laid onto
the machine, and what one GPU sends on each axis.

Left, the model replicas (TP x CP x PP consecutive ranks, order [TP, CP, PP, DP]) along the
GPUs, with the 3,072-GPU pods behind them: a replica that spans two pods is drawn black
(`figures.llama3.replica_pods`). Right, the bytes one GPU sends for one layer and one
sequence on TP (sequence parallel), CP (Llama 3's all-gather of K and V) and PP (one chunk
boundary, its 1/TP with SP), from the formulas the axis files are tested against.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import ModelConfig
from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.costmodel.table4 import Table4Row
from ...plan.formulas.collectives import wire_bytes
from ...plan.formulas.context_parallel import cp_kv_bytes, cp_layer_bytes
from ...plan.formulas.tensor_parallel import tp_layer_bytes
from ...plan.memory import BF16_MIXED
from ..figures.llama3 import draw_replicas
from ..style import COLORS, PAGE_WIDTH
from ..widgets import choice, explorer, powers

DEFAULTS = dict(tp=8, cp=16, pp=16, dp=8, seq_len=131072, pod_size=LLAMA3_CLUSTER.pod_size)


def layer_bytes(tp: int, cp: int, pp: int, seq_len: int) -> dict[str, float]:
    """Bytes one GPU sends for one layer of one sequence, by axis (bf16, SP on when tp > 1)."""
    m, act = ModelConfig.preset("llama3-405b"), BF16_MIXED.act_bytes
    tokens = seq_len // cp
    kv = cp_kv_bytes(tokens, max(m.n_kv_heads // tp, 1), m.head_dim, act)
    return {"tp": tp_layer_bytes(tokens, m.dim, tp, act) if tp > 1 else 0,
            "cp": cp_layer_bytes(kv, cp, "allgather"),
            "pp": 2 * wire_bytes("send", pp, tokens * m.dim * act // tp) if pp > 1 else 0}


def figure(**values):
    kw = {**DEFAULTS, **values}
    gpus = kw["tp"] * kw["cp"] * kw["pp"] * kw["dp"]
    row = Table4Row(gpus, kw["tp"], kw["cp"], kw["pp"], kw["dp"], kw["seq_len"], 0, 0)
    fig, (left, right) = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 5),   # replicas, then bytes
                                      gridspec_kw={"height_ratios": [1, 1.3]})
    draw_replicas(left, row, kw["pod_size"])
    left.set_xlabel(f"GPU rank; grey bands: pods of {kw['pod_size']:,}; black: a replica in two pods",
                    fontsize=8)
    left.set_title(f"TP{kw['tp']} CP{kw['cp']} PP{kw['pp']} DP{kw['dp']} = {gpus:,} GPUs, "
                   f"a replica = {kw['tp'] * kw['cp'] * kw['pp']:,} GPUs", fontsize=9)
    sent = layer_bytes(kw["tp"], kw["cp"], kw["pp"], kw["seq_len"])
    right.bar(range(3), [v / 1e6 for v in sent.values()], color=[COLORS[a] for a in sent])
    right.set_xticks(range(3))
    right.set_xticklabels([a.upper() for a in sent])
    right.set_ylabel("MB per GPU, one layer", fontsize=8)
    right.set_title(f"one sequence of {kw['seq_len']:,} tokens", fontsize=9)
    fig.tight_layout()
    return fig


CONTROLS = {"tp": powers(0, 4), "cp": powers(0, 5), "pp": powers(0, 6), "dp": powers(0, 8),
            "seq_len": powers(13, 17, "seq len"),
            "pod_size": choice([1024, 2048, 3072, 4096], "pod GPUs")}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every CP degree
# (the long-context stage's axis); every value of the other controls one at a time.
WEB = {"cp": list(CONTROLS["cp"].values)}
ALONE = {name: list(CONTROLS[name].values) for name in ("tp", "pp", "dp", "seq_len", "pod_size")}


def explore(**defaults):
    """Sliders over the four degrees, the sequence and the pod size."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=3)
