"""The numbers the tensor_parallel chapter states (book/tensor_parallel.md), computed once.

Llama 3 405B's shapes come from its preset, its layouts from the cost model's Table 4
(`costmodel.table4`), bytes from `formulas`, times from the cost model. Facts the paper
reports live in `numbers.llama3`; what is here is derived from them (marked so).
"""
from __future__ import annotations

from dataclasses import replace
from functools import cache

from ...plan.config import ModelConfig
from ...plan.costmodel.constants import TABLE4_BATCH_TOKENS
from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.costmodel import frameworks
from ...plan.costmodel.table4 import PAPER_SPLIT, TABLE4
from ...plan.costmodel.time import estimate
from ...plan.flops import flops_per_token
from ...plan.flops import layer_param_count, param_count
from ...plan.formulas.collectives import wire_bytes
from ...plan.formulas.data_parallel import dp_bytes
from ...plan.memory import BF16_MIXED
from .. import replays
from .core import Number, derived, from_replay, replayed_ms
from .core import in_scenario

GB = 1e9


def _why_not_data_parallel(m: ModelConfig) -> dict[str, Number]:
    """Data parallelism alone on Llama 3 405B: the batch caps the ranks, one sequence's
    activations overflow a GPU, and ZeRO-3 moves the whole model per sequence."""
    row1 = TABLE4[0]
    seq = row1.seq_len
    n = param_count(m)
    zero3 = dp_bytes(n, TABLE4_BATCH_TOKENS // seq, zero=3, microbatches=1,
                     grad_bytes=BF16_MIXED.grad_bytes, param_bytes=BF16_MIXED.param_bytes)
    zero3_s = zero3 / (LLAMA3_CLUSTER.inter_node_GBps * GB)
    compute_s = flops_per_token(m, seq) * seq / (row1.tflops_per_gpu * 1e12)
    src = "book/tensor_parallel.md, opening"
    return {
        "layer_params_b": derived(layer_param_count(m) / 1e9, "{:.1f}", "flops.layer_param_count"),
        "layer_weights_gb": derived(layer_param_count(m) * BF16_MIXED.param_bytes / GB, "{:.1f} GB", "bf16"),
        "zero3_tb": derived(zero3 / 1e12, "{:.1f} TB", "formulas.data_parallel.dp_bytes(zero=3), one sequence"),
        "zero3_s": derived(zero3_s, "{:.0f} s", "at one 400 Gb/s NIC, " + src),
        "seq_compute_s": derived(compute_s, "{:.0f} s", "6N + 12Lhs FLOPs at row 1's 430 TFLOP/s"),
    }


def _vocab(m: ModelConfig) -> dict[str, Number]:
    table = m.vocab_size * m.dim
    return {
        "vocab_params_b": derived(table / 1e9, "{:.1f}", "vocab x dim"),
        "vocab_gb": derived(table * BF16_MIXED.param_bytes / GB, "{:.1f} GB", "bf16"),
        "logits_over_hidden": derived(m.vocab_size / m.dim, "{:.0f}", "vocab / dim: logits vs hidden"),
    }


@cache
def _row1_estimates():
    """Table 4 row 1 as the cost model predicts it: TP inside a server (as trained), and
    the same layout with TP across servers (one GPU per server: TP's ring on the NIC)."""
    m, row1 = ModelConfig.preset("llama3-405b"), TABLE4[0]
    across = replace(LLAMA3_CLUSTER, gpus_per_node=1)
    pc, precision, eff = frameworks.apply(frameworks.LLAMA3, m, row1.parallel())
    # under Llama 3's stack, as costmodel.table4 (the book's one reading of the run)
    return [estimate(m, pc, c, row1.seq_len, global_batch_tokens=TABLE4_BATCH_TOKENS, microbatch_size=1,
                     recompute="none", precision=precision, efficiency=eff, stage_split=PAPER_SPLIT)
            for c in (LLAMA3_CLUSTER, across)]


def _llama3_tp(m: ModelConfig) -> dict[str, Number]:
    row1, act = TABLE4[0], BF16_MIXED.act_bytes
    a = row1.seq_len * m.dim * act                                   # one [1, s, h] activation
    inside, across = _row1_estimates()
    # Row 1's own step, compute and TP time are numbers.mfu's (row1_step_s, ...); here the
    # shares and the what-if with TP across servers, from the same estimate call.
    cm = "cost model (costmodel.estimate), Table 4 row 1"
    return {
        "allreduce_mb": derived(wire_bytes("all_reduce", row1.tp, a) / 1e6, "{:.0f} MB", "ring, t = 8"),
        "microbatches": derived(inside.microbatches, "{:,}", "2,048 sequences / DP 64"),
        "layers_per_gpu": derived(m.n_layers / row1.pp, "{:.3g}", "126 layers / PP 16"),
        **in_scenario({"tp_share": derived(inside.time_breakdown_s["tp"] / inside.time_breakdown_s["compute"],
                                           "{:.0%}", cm)}, "table4-row1"),
        **in_scenario({
            "roce_tp_s": derived(across.time_breakdown_s["tp"], "{:.1f} s", cm + ", TP across servers"),
            "roce_tp_share": derived(across.time_breakdown_s["tp"] / across.time_breakdown_s["compute"],
                                     "{:.0%}", cm + ", TP across servers"),
            "roce_step_s": derived(across.step_time_s, "{:.1f} s", cm + ", TP across servers"),
        }, "row1-tp-across-servers"),
    }


def _replayed() -> dict[str, Number]:
    """Plain SP and the collective matmul replayed at Llama 3 8B's shapes on H100s."""
    plain, ring = replays.replayed("tensor_parallel"), replays.replayed("tensor_parallel_overlap")
    src = "replays.replayed('{}'), rank mean"
    return {
        "replay_plain_exposed": replayed_ms(plain.exposed_s["tp"], src.format("tensor_parallel")),
        "replay_overlap_exposed": replayed_ms(ring.exposed_s["tp"],
                                              src.format("tensor_parallel_overlap")),
        "replay_overlap_faster": from_replay(1 - ring.step_time_s / plain.step_time_s, "{:.0%}",
                                             "replayed step times, 1 - overlapped / plain"),
    }


def numbers() -> dict[str, Number]:
    m = ModelConfig.preset("llama3-405b")
    return {**_why_not_data_parallel(m), **_vocab(m), **_llama3_tp(m), **_replayed()}
