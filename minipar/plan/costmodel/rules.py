"""The four rules of thumb of choosing a layout, each as the ratio the cost model computes.

Chapter "Four dimensions at once". Each function returns the one number a rule compares
with 1 (or a budget): when it crosses, the next axis is due. They are the same functions
`estimate` uses (`kernels`, `exposure`), evaluated on one layer or one step, so that the
chapter's threshold plots and the planner cannot disagree.

    TP     exposed TP seconds / matmul seconds of a block   ~ (t-1) / h * peak / bandwidth
    PP     the bubble (p-1) / (v m + p-1)                   (formulas.bubble_fraction)
    DP     exposed DP seconds / step                        ~ params / (tokens per rank)
    CP     CP seconds / attention seconds of a block        ~ (cp-1) kv / (h s)
"""
from __future__ import annotations

from dataclasses import replace

from ..config import ModelConfig, ParallelConfig
from .constants import LLAMA3_EFFICIENCY, Efficiency
from .exposure import cp_seconds, tp_exposed_seconds
from .hardware import Cluster
from .kernels import attention_seconds, layer_matmul_seconds
from .memory import memory_per_gpu
from .scenario import Scenario
from .time import estimate
from .workload import Workload
from ..memory import BF16_MIXED


def llama_of_width(dim: int, n_layers: int = 32) -> ModelConfig:
    """A Llama-3-shaped model of width `dim`: heads of 128, 8 KV heads, FFN 3.5 dim."""
    return ModelConfig(n_layers=n_layers, dim=dim, n_heads=dim // 128, n_kv_heads=8,
                       ffn_dim=int(3.5 * dim) // 256 * 256, vocab_size=128256,
                       max_seq_len=131072, name=f"llama-width-{dim}")


def tp_ratio(model: ModelConfig, tp: int, cluster: Cluster, tokens: int = 8192,
             overlap: bool = False, eff: Efficiency = LLAMA3_EFFICIENCY) -> float:
    """Exposed TP seconds over the matmul seconds of one block on `tokens` tokens, TP `tp`
    with SP (and collective matmul if `overlap`). Above ~0.1-0.2, TP costs more than it
    saves: the width is too small for that t, or the group left the server."""
    pc = ParallelConfig(tp=tp, sp=tp > 1, tp_overlap=overlap and tp > 1)
    s = Scenario(model, pc, cluster, Workload(tokens, 1), BF16_MIXED, eff)
    mm = layer_matmul_seconds(model, tokens, tp, cluster)
    comm = tp_exposed_seconds(s, mm)
    return comm / sum(f + b for f, b in mm.values())


def cp_ratio(model: ModelConfig, seq_len: int, cp: int, cluster: Cluster, tp: int = 8,
             impl: str = "allgather", eff: Efficiency = LLAMA3_EFFICIENCY) -> float:
    """Unhidden CP seconds over the attention seconds of one block and sequence, with CP
    `cp` after TP `tp` (`impl` "ring" hides what it can behind attention)."""
    pc = ParallelConfig(tp=tp, cp=cp, sp=tp > 1, cp_impl=impl)
    s = Scenario(model, pc, cluster, Workload(seq_len, 1), BF16_MIXED, eff)
    t_att = attention_seconds(model, seq_len // cp, seq_len, cp, tp, cluster, eff.attention)
    return cp_seconds(s, t_att) / t_att


def attention_share(model: ModelConfig, seq_len: int, cluster: Cluster, tp: int = 8,
                    eff: Efficiency = LLAMA3_EFFICIENCY) -> float:
    """Attention's share of a block's compute at sequence length `seq_len`: past ~0.5,
    attention dominates and memory of activations grows as s; CP is the axis that splits it."""
    t_att = attention_seconds(model, seq_len, seq_len, 1, tp, cluster, eff.attention)
    mm = layer_matmul_seconds(model, seq_len, tp, cluster)
    return t_att / (t_att + sum(f + b for f, b in mm.values()))


def dp_share(model: ModelConfig, pc: ParallelConfig, cluster: Cluster, seq_len: int,
             global_batch: int, eff: Efficiency = LLAMA3_EFFICIENCY,
             framework: str | None = None) -> float:
    """Exposed DP seconds over the step of a layout (micro-batches of one), under
    `framework`'s reduce dtype, buckets and ZeRO stage when one is named."""
    e = estimate(model, pc, cluster, seq_len, global_batch=global_batch, efficiency=eff,
                 framework=framework)
    return e.time_breakdown_s["dp"] / e.step_time_s


def memory_gb(model: ModelConfig, pc: ParallelConfig, seq_len: int, global_batch: int,
              recompute: str = "none") -> float:
    """GB on the fullest GPU of a layout (`memory.memory_per_gpu`)."""
    m = global_batch // pc.dp
    pc = replace(pc, microbatches=m)
    return memory_per_gpu(model, pc, Workload(seq_len, global_batch, 1, recompute))["total"] / 1e9
