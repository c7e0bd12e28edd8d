"""The numbers the context_parallel chapter states (book/context_parallel.md), computed once.

Llama 3 405B at Table 4's long-context row (TP8 CP16, 131,072 tokens): activations per
token and layer (formulas.activation_elements), the K/V block and the bytes each CP
implementation sends (formulas.cp_wire_bytes_per_step), the all-gather against the
attention it feeds (the cost model's constants); and a multi-head 7B-like model where
Ulysses wins.
"""
from __future__ import annotations

import dataclasses

from ...plan.config import ModelConfig
from ...plan.costmodel.constants import CAUSAL_FRACTION, LLAMA3_EFFICIENCY
from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.costmodel.kernels import attention_flops_per_s
from ...plan.costmodel.table4 import TABLE4
from ...plan.formulas.context_parallel import cp_wire_bytes_per_step
from ...plan.formulas.memory import activation_elements
from ...plan.memory import BF16_MIXED
from ...plan.schedules import stage_layer_counts
from ...trainer.parallel.context_analysis import attention_work, contiguous_chunks
from .. import replays
from .core import Number, derived, from_replay, measured, replayed_ms

# A 7B-like model with full multi-head attention (every query head its own K/V head).
MHA_7B = ModelConfig(n_layers=32, dim=4096, n_heads=32, n_kv_heads=32, ffn_dim=11008,
                     vocab_size=32000, name="multi-head 7B-like")
MHA_CP = 32


def layer_bytes_per_rank(model: ModelConfig, seq: int, cp: int, tp: int, impl: str) -> float:
    """Bytes one CP rank sends for one layer, one sequence, forward and backward, in bf16."""
    return cp_wire_bytes_per_step(model, 1, seq, cp, impl, tp=tp, n_layers=1,
                                  dtype_bytes=BF16_MIXED.act_bytes)


def attention_forward_flops(model: ModelConfig, seq: int, cp: int, tp: int) -> float:
    """One GPU's causal attention forward for one layer: QK^T and PV (4 s/cp s d per head),
    half of the square under the causal mask."""
    return 4 * (seq // cp) * seq * model.head_dim * (model.n_heads // tp) * CAUSAL_FRACTION


def _activations(m: ModelConfig, row) -> dict[str, Number]:
    per_token = activation_elements(m, row.tp, True, "none")
    stage_layers = max(stage_layer_counts(m.n_layers, row.pp))
    per_layer = per_token * BF16_MIXED.act_bytes * row.seq_len
    return {
        "values_per_token_layer": derived(per_token, "{:,.0f}", source="formulas.memory.activation_elements, TP8 + SP"),
        "kb_per_token_layer": derived(per_token * BF16_MIXED.act_bytes / 1e3, "{:.0f} KB"),
        "long_layer_gb": derived(per_layer / 1e9, "{:.1f} GB", source="131,072 tokens, one layer, no CP"),
        "stage_layers": derived(stage_layers, source="126 layers on 16 stages"),
        "long_stage_gb": derived(per_layer * stage_layers / 1e9, "{:.0f} GB"),
        "naive_imbalance": derived(_imbalance(row.seq_len, row.cp), "{:.0f}",
                                   source="attention_work, contiguous chunks"),
    }


def _imbalance(seq: int, cp: int) -> float:
    work = attention_work(seq, cp, contiguous_chunks)
    return max(work) / min(work)


def _wire(m: ModelConfig, row) -> dict[str, Number]:
    s, cp, tp = row.seq_len, row.cp, row.tp
    out = {}
    for impl in ("ring", "allgather", "ulysses"):
        out[f"{impl}_mb"] = derived(layer_bytes_per_rank(m, s, cp, tp, impl) / 1e6, "{:,.0f} MB",
                                    source="formulas.context_parallel.cp_wire_bytes_per_step")
    for impl in ("allgather", "ulysses"):
        out[f"mha_{impl}_mb"] = Number(layer_bytes_per_rank(MHA_7B, s, MHA_CP, 1, impl) / 1e6,
                                       "{:,.0f} MB", source="formulas.context_parallel.cp_wire_bytes_per_step")
    out["mha_heads"] = Number(MHA_7B.n_heads)
    out["mha_cp"] = Number(MHA_CP)
    return out


def inter_node_Bps() -> float:
    """What one CP rank's link delivers: the NIC at the cost model's inter-node efficiency
    (CP16 at TP8 spans sixteen servers)."""
    return LLAMA3_CLUSTER.inter_node_GBps * 1e9 * LLAMA3_EFFICIENCY.network_inter


def attention_Fps(seq: int, cp: int) -> float:
    """FLOP/s of the attention kernel Llama 3's stack is assumed to run (cuDNN's) on one CP
    rank's chunks, as measured: the cost model's own rate."""
    return attention_flops_per_s("cudnn", seq, cp, LLAMA3_CLUSTER)


def allgather_vs_attention(model: ModelConfig, seq: int, cp: int, tp: int) -> tuple[float, float, float]:
    """(bytes, seconds) of one layer's forward all-gather of K/V per rank, and the seconds of
    the causal attention it feeds at the cost model's attention efficiency."""
    gather = layer_bytes_per_rank(model, seq, cp, tp, "allgather") / 2   # the forward half
    flops = attention_forward_flops(model, seq, cp, tp)
    return (gather, gather / inter_node_Bps(),
            flops / attention_Fps(seq, cp))


def _why_allgather(m: ModelConfig, row) -> dict[str, Number]:
    s, cp, tp = row.seq_len, row.cp, row.tp
    link = inter_node_Bps()
    flops = attention_forward_flops(m, s, cp, tp)
    gather, _, _ = allgather_vs_attention(m, s, cp, tp)
    mha = dataclasses.replace(m, n_kv_heads=m.n_heads)
    gather_mha, _, _ = allgather_vs_attention(mha, s, cp, tp)
    q, kv = m.n_heads * m.head_dim, 2 * m.n_kv_heads * m.head_dim
    return {
        "q_values": derived(q, source="heads x head_dim"),
        "kv_values": derived(kv, source="2 x kv_heads x head_dim"),
        "q_over_kv": derived(q // kv, "{}"), "mha_over_kv": derived(2 * q // kv, "{}"),
        "gather_mb": derived(gather / 1e6, "{:.0f} MB", source="the forward all-gather, one layer"),
        "network_eff": measured(LLAMA3_EFFICIENCY.network_inter, "{:.0%}",
                              source="costmodel.constants: nccl-tests bus bandwidth, 400 Gb/s NDR"),
        "gather_ms": derived(gather / link * 1e3, "{:.1f} ms"),
        "attention_tflop": derived(flops / 1e12, "{:.1f} TFLOP", source="4 (s/cp) s d heads/2"),
        "attention_eff": measured(attention_Fps(s, cp) / LLAMA3_CLUSTER.peak_flops, "{:.0%}",
                                source="costmodel.constants: cuDNN attention, measured (benchmarks/kernels)"),
        "attention_ms": derived(flops / attention_Fps(s, cp) * 1e3, "{:.0f} ms"),
        "gather_mha_ms": derived(gather_mha / link * 1e3, "{:.0f} ms",
                                 source="the same with 128 KV heads"),
    }


def _replayed() -> dict[str, Number]:
    """Ring and all-gather attention replayed at Llama 3 8B's shapes, 32K tokens, on H100s."""
    ring, gather = replays.replayed("context_parallel"), replays.replayed("context_parallel_allgather")
    src = "replays.replayed('{}'), rank mean"
    hidden, exposed = ring.hidden_s["cp"], ring.exposed_s["cp"]
    return {
        "replay_ring_hidden_share": from_replay(hidden / (hidden + exposed), "{:.0%}",
                                                src.format("context_parallel")),
        "replay_allgather_exposed": replayed_ms(gather.exposed_s["cp"],
                                                src.format("context_parallel_allgather")),
        "replay_allgather_share": from_replay(gather.exposed_s["cp"] / gather.step_time_s, "{:.1%}",
                                              "exposed CP time / the step, replayed"),
        "replay_seq": Number(replays.RUNS["context_parallel"].seq_len),
    }


def numbers() -> dict[str, Number]:
    m, row = ModelConfig.preset("llama3-405b"), TABLE4[2]
    return {**_activations(m, row), **_wire(m, row), **_why_allgather(m, row), **_replayed()}
