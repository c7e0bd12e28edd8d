"""The numbers the fourd chapter states (book/fourd.md), computed once.

The chapter opens with the method by hand: each axis's inequality worked from
`plan.formulas`, `plan.flops` and four measured speeds (`_by_hand`), before any prediction.
The rules' numbers are `costmodel.rules`', the worked examples the planner's, the band's rows
`costmodel.band`'s. The evaluation's errors are `numbers.accuracy`'s (the appendix "How good
is the cost model"), Table 4's rows as the cost model predicts them `numbers.mfu`'s, the
paper's facts `numbers.llama3`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from ...plan import costmodel as cm
from ...plan.config import ModelConfig, ParallelConfig
from ...plan.costmodel import rules
from ...plan.costmodel.band import MIN_ROWS, band_errors
from ...plan.costmodel.constants import CAUSAL_FRACTION, NIC_BUSBW_FRACTION, NVLINK_BUSBW_FRACTION
from ...plan.costmodel.planner import (MEMORY_HEADROOM, MIN_TOKENS_PER_CP_RANK, describe,
                                       memory_budget_gb, plan)
from ...plan.flops import attention_flops_per_token, flops_per_token, layer_param_count, param_count
from ...plan.formulas.collectives import wire_bytes
from ...plan.formulas.context_parallel import cp_kv_bytes, cp_layer_bytes
from ...plan.formulas.pipeline_parallel import pp_bytes
from ...plan.formulas.tensor_parallel import tp_layer_bytes
from ...plan.memory import BF16_MIXED
from .core import Number, assumed, derived, in_scenario, predicted
from .llama3 import HBM_BYTES

_RULES = "costmodel.rules on Llama 3's cluster"
_PLAN = "costmodel.planner.plan"
L405 = "llama3-405b"
# The notebook's planning exercise (`exercises.fourd.check_plan` takes these as its defaults):
# the chapter states its cluster, batch and margin.
# The chapter's three worked model/cluster pairs (model, GPU, GPUs, tokens per step, sequence):
# each rule's threshold plot places them, at the layout the planner chose for them.
WORKED = {"405B": ("llama3-405b", "llama3", 8192, 16 * 2**20, 8192),
          "70B": ("llama3-70b", "h100", 1024, 4 * 2**20, 8192),
          "8B": ("llama3-8b", "a100", 64, 4 * 2**20, 8192)}


def worked_cluster(gpu: str):
    return cm.LLAMA3_CLUSTER if gpu == "llama3" else cm.gpu_cluster(gpu)


@cache
def worked_plan(key: str):
    """The planner's best layout for one worked pair (`WORKED`): an `Estimate`."""
    name, gpu, gpus, tokens, seq = WORKED[key]
    return plan(ModelConfig.preset(name), worked_cluster(gpu), gpus, seq, tokens, top=1).ranked[0]


PLAN_EXERCISE = dict(model="llama3-70b", gpu="h100", gpus=256, seq_len=8192,
                     batch_tokens=2 * 2**20, points=2.0)


def numbers() -> dict[str, Number]:
    return {**_by_hand(), **_band(), **_rule1(), **_headroom(), **_rules(), **_plans(),
            **_exercise()}


# ------------------------------------------------------------------ the method, by hand
# Each axis's inequality, worked with a pencil: bytes from `plan.formulas`, FLOPs from
# `plan.flops`, and four measured speeds, nothing else (no kernel curves, no latencies, no
# overlap windows: those are the cost model's). The 4D chapter opens with them.
_HAND = "by hand: plan.formulas and plan.flops at the measured speeds"
BUBBLE_BUDGET = 0.1          # the PP inequality's bubble: a tenth of the step


@dataclass(frozen=True)
class Speeds:
    """The by-hand method's four speeds, per GPU: the GEMMs' FLOP/s (the best measured
    fraction of peak), the attention kernel's on a CP rank's chunk, and bytes/s inside a
    server (NVLink) and across servers (one NIC), nccl-tests' bus bandwidths."""
    flops: float
    attention: float
    nvlink: float
    nic: float


def speeds(cluster=cm.LLAMA3_CLUSTER, attention: str = "attention.cudnn_cp_chunk") -> Speeds:
    c = cm.all_constants()
    return Speeds(c["gemm.max_fraction"].value * cluster.peak_flops, c[attention].value * 1e12,
                  NVLINK_BUSBW_FRACTION * cluster.intra_node_GBps * 1e9,
                  NIC_BUSBW_FRACTION * cluster.inter_node_GBps * 1e9)


def tp_by_hand(model: ModelConfig, t: int, link: float, v: Speeds, tokens: int = 8192) -> float:
    """TP's seconds over its matmuls' in one block, forward and backward (sequence parallel:
    the bytes of four all-reduces of the block's [tokens, h] activations in bf16, at `link`
    bytes/s; 6 FLOPs per weight and token, over t GPUs): below 1 collective matmul can hide it."""
    comm = tp_layer_bytes(tokens, model.dim, t, 2, sp=True) / link
    return comm / (6 * layer_param_count(model) * tokens / t / v.flops)


def cp_by_hand(model: ModelConfig, seq: int, c: int, t: int, v: Speeds) -> float:
    """All-gather CP's seconds over its attention's in one block: K and V of the rank's s/c
    tokens and n_kv/t heads gathered, their gradients reduce-scattered, across servers; the
    causal half of attention's 12 h s FLOPs per token on the rank's s/c tokens and 1/t heads."""
    kv = cp_kv_bytes(seq // c, model.n_kv_heads // t, model.head_dim, 2)
    comm = cp_layer_bytes(kv, c, "allgather") / v.nic
    flops = CAUSAL_FRACTION * attention_flops_per_token(model, seq) / model.n_layers * seq / c / t
    return comm / (flops / v.attention)


def pp_by_hand(model: ModelConfig, t: int, v: Speeds, tokens: int = 8192) -> float:
    """A pipeline send (one chunk boundary, one micro-batch, its 1/t under SP, across servers)
    over the forward of a one-layer chunk it hides behind."""
    send = pp_bytes(tokens, model.dim, 2, 1, 2, stage=0, sp_tp=t) / v.nic
    return send / (2 * layer_param_count(model) * tokens / t / v.flops)


def reduce_scatter_by_hand(model: ModelConfig, t: int, p: int, group: int, v: Speeds) -> float:
    """Seconds of one fp32 reduce-scatter of a rank's N/(t p) gradients over the dp x cp
    group, through one NIC (the group has one GPU per server)."""
    return wire_bytes("reduce_scatter", group, int(4 * param_count(model) / (t * p))) / v.nic


def dp_by_hand(model: ModelConfig, seq: int, t: int, c: int, p: int, group: int, v: Speeds) -> float:
    """ZeRO-2 as Llama 3 runs it: one micro-batch's fp32 reduce-scatter
    (`reduce_scatter_by_hand`) over that micro-batch's compute on the rank, all its FLOPs at
    the GEMMs' speed."""
    rs = reduce_scatter_by_hand(model, t, p, group, v)
    return rs / (flops_per_token(model, seq) * seq / (t * c * p) / v.flops)


def microbatches_for(p: int, budget: float = BUBBLE_BUDGET) -> float:
    """v m at which the interleaved bubble (p-1)/(v m + p-1) is `budget`: (p-1)(1 - b)/b."""
    return (p - 1) * (1 - budget) / budget


def _crossing(ratio, budget: float, xs) -> int:
    """The first x at which a falling `ratio(x)` is at or under `budget`."""
    return next(x for x in xs if ratio(x) <= budget)


def _by_hand() -> dict[str, Number]:
    """The four inequalities worked for Llama 3 405B on Table 4's layouts."""
    m, v, src = ModelConfig.preset(L405), speeds(), _HAND
    tp_nvl, tp_nic = tp_by_hand(m, 8, v.nvlink, v), tp_by_hand(m, 8, v.nic, v)
    cp = cp_by_hand(m, 131072, 16, 8, v)
    row = [cm.TABLE4_BATCH_TOKENS // (r.seq_len * r.dp) for r in cm.TABLE4]      # m per DP rank
    dp = [dp_by_hand(m, r.seq_len, r.tp, r.cp, r.pp, r.dp * r.cp, v) for r in cm.TABLE4]
    dp_s_star = _crossing(lambda s: dp_by_hand(m, s, 8, 1, 16, 64, v), 1.0, range(1024, 65537, 256))
    out = {"hand_c": derived(layer_param_count(m) / m.dim ** 2, "{:.1f}", source="flops.layer_param_count / h^2"),
           "hand_flops": Number(v.flops / 1e12, "{:.0f} TFLOP/s", source="gemm.max_fraction x the H100's peak"),
           "hand_tp8": Number(tp_nvl, "{:.0%}", source=src),
           "hand_tp8_h": Number(tp_nvl * m.dim, "{:,.0f}", source=src + ": h x the ratio (N_layer = c h^2)"),
           "hand_tp8_nic": Number(tp_nic, "{:.1f}", source=src + ", one NIC per GPU"),
           "hand_tp8_nic_h": Number(tp_nic * m.dim, "{:,.0f}", source=src + ", one NIC per GPU"),
           "hand_cp16": Number(cp, "{:.0%}", source=src + ", 128K, CP16 after TP8"),
           "hand_cp16_s": Number(cp * 131072, "{:,.0f}", source=src + ": s x the ratio"),
           "hand_cp16_8k": Number(cp_by_hand(m, 8192, 16, 8, v), "{:.0%}", source=src + ", 8K, CP16"),
           "hand_pp_send": Number(pp_by_hand(m, 8, v), "{:.0%}", source=src),
           "hand_vm": Number(microbatches_for(cm.TABLE4[0].pp), "{:.0f}", source="(p-1)(1-b)/b at b = 10%"),
           "bubble_budget": Number(BUBBLE_BUDGET, "{:.0%}", source="the PP inequality's budget"),
           "hand_dp_s": Number(dp_s_star, "{:,}", source=src + ": tokens per micro-batch where the ratio is 1"),
           "hand_dp_over": Number(dp_s_star / cm.TABLE4[0].seq_len, "{:.1f}", source=src + ": over 8K")}
    for i, (r, mb, ratio) in enumerate(zip(cm.TABLE4, row, dp), 1):
        chunks = r.parallel().virtual_stages
        out.update({f"hand_row{i}_vm": Number(chunks * mb, "{:,}", source="chunks per rank x micro-batches"),
                    f"hand_row{i}_dp": Number(ratio, "{:.1f}", source=src)})
    return out


BAND_KINDS = ("llama3", "nanotron", "nemo", "all")     # the stacks the chapter states, and all


def _band() -> dict[str, Number]:
    """The rows and the signed errors (MFU points) each stack's band is made of
    (`costmodel.band.band_errors`; "all": every row's, for a prediction without a stack)."""
    out = {"band_min_rows": Number(MIN_ROWS, source="costmodel.band.MIN_ROWS")}
    for kind in BAND_KINDS:
        # a stack with fewer than MIN_ROWS rows would take every row's: the source says so
        used, errors = band_errors(None if kind == "all" else kind)
        src = f"costmodel.band.band_errors({kind!r}): {used}'s rows"
        out.update({f"band_{kind}_rows": Number(len(errors), source=src),
                    f"band_{kind}_min": Number(min(errors), "{:+.1f}", source=src),
                    f"band_{kind}_max": Number(max(errors), "{:+.1f}", source=src)})
    return out


def _rule1() -> dict[str, Number]:
    m, c = ModelConfig.preset(L405), cm.LLAMA3_CLUSTER
    state = BF16_MIXED.state_bytes_per_param * param_count(m)
    row = cm.TABLE4[0]
    return {"state_gpus": derived(-(-state // HBM_BYTES), "{:,.0f}",
                                  source="state / nvidia-smi's 85.5 GB, rounded up"),
            "state_per_gpu_gb": derived(state / (row.tp * row.pp) / 1e9, "{:.0f} GB", source="state / (TP8 x PP16)"),
            "ridge": Number(c.peak_flops / c.hbm_Bps, "{:.0f}", source="H100: peak FLOP/s / HBM bytes/s")}


def _rules() -> dict[str, Number]:
    c, m = cm.LLAMA3_CLUSTER, ModelConfig.preset(L405)
    narrow, wide = rules.llama_of_width(4096), rules.llama_of_width(16384)
    return {
        "tp8_wide": Number(rules.tp_ratio(wide, 8, c), "{:.0%}", source=_RULES),
        "tp8_narrow": Number(rules.tp_ratio(narrow, 8, c), "{:.0%}", source=_RULES),
        "tp16_wide": Number(rules.tp_ratio(wide, 16, c), "{:.1f}", source=_RULES),
        "att_8k": derived(rules.attention_share(m, 8192, c), "{:.0%}", source=_RULES + ": measured kernels' time"),
        "att_128k": derived(rules.attention_share(m, 131072, c), "{:.0%}", source=_RULES + ": measured kernels' time"),
        "cp16_8k": Number(rules.cp_ratio(m, 8192, 16, c), "{:.0%}", source=_RULES),
        "cp16_128k": Number(rules.cp_ratio(m, 131072, 16, c), "{:.1%}", source=_RULES),
        "min_cp_tokens": Number(MIN_TOKENS_PER_CP_RANK, source="planner.MIN_TOKENS_PER_CP_RANK"),
        "w_wide": Number(wide.dim, source="rules.llama_of_width"),
        "w_narrow": Number(narrow.dim, source="rules.llama_of_width; Llama 3 8B's width"),
        "w_70b": Number(ModelConfig.preset("llama3-70b").dim, source="Llama 3 70B's width"),
        "tp8_h_star": Number(_crossing(lambda h: rules.tp_ratio(rules.llama_of_width(h), 8, c), TP_BUDGET,
                                       range(1024, 65536, 128)), "{:,}", source=_RULES + ": the width where TP8 costs 20%"),
        "tp_budget": Number(TP_BUDGET, "{:.0%}", source="the TP rule's budget"),
        "cp16_s_star": Number(_crossing(lambda s: rules.cp_ratio(m, s, 16, c), 1.0, range(8192, 131073, 1024)),
                              "{:,}", source=_RULES + ": where CP16's all-gather equals its attention"),
        **_dp_by_framework(),
    }


TP_BUDGET = 0.2
DP_FRAMEWORKS = ("llama3", "megatron", "nanotron")
DP_RULE_BATCH = 1024             # sequences of 8K per step in the DP rule's plot


def dp_rule_share(dp: int, framework: str) -> float:
    """Rule 5's ratio: exposed DP over the step of Llama 3 70B at TP8 with `dp` replicas and
    a batch of `DP_RULE_BATCH` sequences of 8K, under `framework`'s reduce
    (`figures.fourd.dp_rule` draws it; `_dp_by_framework` quotes it)."""
    pc = ParallelConfig(tp=8, sp=True, dp=dp, zero=1)
    return rules.dp_share(ModelConfig.preset("llama3-70b"), pc, cm.LLAMA3_CLUSTER, 8192, DP_RULE_BATCH,
                          framework=framework)


def _dp_by_framework(dp: int = 32) -> dict[str, Number]:
    """`dp_rule_share` at `dp` replicas under each framework."""
    out = {"dp_fw_tokens": Number(DP_RULE_BATCH * 8192 // dp, "{:,}", source="the batch's tokens over the replicas"),
           "dp_fw_batch": Number(DP_RULE_BATCH, "{:,}", source="figures.fourd.dp_rule's batch")}
    for fw in DP_FRAMEWORKS:
        out[f"dp_fw_{fw}"] = Number(dp_rule_share(dp, fw), "{:.1%}", source=_RULES + f", --framework {fw}")
    return out


@cache
def _plan405(gpus: int, headroom: float = MEMORY_HEADROOM):
    return plan(ModelConfig.preset(L405), cm.LLAMA3_CLUSTER, gpus, 8192, cm.TABLE4_BATCH_TOKENS,
                top=None, headroom=headroom)


def _headroom() -> dict[str, Number]:
    """Rule 1's headroom, and what the 8K-GPU plan would be without it."""
    full = _plan405(8192, 0.0).ranked[0]
    src = "planner.MEMORY_HEADROOM"
    return {"headroom": assumed(MEMORY_HEADROOM, "{:.0%}", source=src),
            "budget_gb": derived(memory_budget_gb(cm.LLAMA3_CLUSTER), "{:.1f} GB",
                                 source="planner.memory_budget_gb: the cost model's HBM x (1 - headroom)"),
            "planner_hbm_gib": assumed(cm.LLAMA3_CLUSTER.hbm_gb * 1e9 / 2**30, "{:.0f} GiB",
                                       source="costmodel.hardware.Cluster.hbm_gb (--hbm-gb): the "
                                              "planner's capacity of an H100, 80 GiB"),
            **in_scenario({"p8k_nohead_best": Number(describe(full), "{}", source=_PLAN + ", headroom 0"),
                           "p8k_nohead_gb": Number(full.memory_gb_per_gpu, "{:.0f} GB",
                                                   source=_PLAN + ", headroom 0")}, "planner")}


def _table4_rank(p, dp: int) -> int:
    return next(i for i, e in enumerate(p.ranked, 1)
                if (e.parallel.tp, e.parallel.cp, e.parallel.pp, e.parallel.dp) == (8, 1, 16, dp)
                and e.parallel.virtual_stages == 8)


def _plans() -> dict[str, Number]:
    out = {}
    for key, gpus, dp in (("p8k", 8192, 64), ("p16k", 16384, 128)):
        p = _plan405(gpus)
        rank = _table4_rank(p, dp)
        out.update({f"{key}_best": Number(describe(p.ranked[0]), "{}", source=_PLAN),
                    f"{key}_best_mfu": predicted(p.ranked[0].mfu, None, _PLAN),
                    f"{key}_fifth_mfu": predicted(p.ranked[4].mfu, None, _PLAN),
                    f"{key}_count": Number(len(p.ranked), source=_PLAN),
                    f"{key}_t4_rank": Number(rank, source=_PLAN),
                    f"{key}_t4": Number(describe(p.ranked[rank - 1]), "{}", source=_PLAN),
                    f"{key}_t4_mfu": predicted(p.ranked[rank - 1].mfu, None, _PLAN)})
    for key, pair in (("p70", "70B"), ("p8b", "8B")):
        best = worked_plan(pair)
        out.update({f"{key}_best": Number(describe(best), "{}", source=_PLAN),
                    f"{key}_mfu": predicted(best.mfu, None, _PLAN),
                    f"{key}_gpus": Number(WORKED[pair][2], source="the worked example")})
    return in_scenario(out, "planner")


def _exercise() -> dict[str, Number]:
    d, source = PLAN_EXERCISE, "exercises.fourd.check_plan's defaults"
    return {"ex_gpus": Number(d["gpus"], source=source),
            "ex_batch": Number(d["batch_tokens"] // 2**20, "{}M", source=source),
            "ex_points": Number(d["points"], "{:g}", source=source)}
