"""The cost model reads the one memory model (`minipar.plan.memory`) for a `Workload`.

Chapter "Memory: where every byte goes". A `Workload` says the batch (sequence length,
micro-batch size, micro-batches per DP rank) and the recompute flag the memory model reads
from the layout; `run_layout` puts them there (and --recompute-layers beside them).
"""
from __future__ import annotations

import functools

from .. import memory
from ..config import ModelConfig, ParallelConfig
from .experts import busiest_rank_load
from .workload import Workload
from ..flops import local_expert_param_count, local_param_count, moe_layer_count
from ..memory import BF16_MIXED, Precision


def param_total_local(model: ModelConfig, tp: int) -> float:
    """Parameters of the whole model as one TP rank holds them (all stages together), a
    mixture of experts' routed experts left out (they are `expert_total_local`'s)."""
    moe = moe_layer_count(model, range(model.n_layers))
    return local_param_count(model, tp, model.n_layers, True, True, moe)


def expert_total_local(model: ModelConfig, tp: int, ep: int) -> float:
    """Routed-expert parameters one EP rank holds, all stages together."""
    return local_expert_param_count(model, tp, ep, moe_layer_count(model, range(model.n_layers)))


def run_layout(pc: ParallelConfig, work: Workload) -> ParallelConfig:
    """The layout as it runs the batch: its micro-batches per DP rank, and the recompute mode
    of the workload (the cost model's flag), else the layout's (the trainer's flag)."""
    recompute = work.recompute if work.recompute != "none" else pc.recompute
    return pc.replace(microbatches=work.microbatches(pc), recompute=recompute)


def layers_recomputed(pc: ParallelConfig, work: Workload) -> int | None:
    """The workload's --recompute-layers, when its full recompute is the one that runs."""
    return work.recompute_layers if work.recompute == "full" else None


def memory_of_rank(model: ModelConfig, pc: ParallelConfig, work: Workload,
                   precision: Precision, stage: int) -> dict[str, float]:
    """Bytes pipeline rank `stage` holds (`memory.memory_of_rank`)."""
    return ranks_memory(model, pc, work, precision, [stage])[0]


def ranks_memory(model: ModelConfig, pc: ParallelConfig, work: Workload,
                 precision: Precision = BF16_MIXED, stages=None) -> list[dict[str, float]]:
    """`memory_of_rank` of pipeline ranks `stages` (every one by default), the layout as it
    runs built once for all of them."""
    run, recomputed, load = run_layout(pc, work), layers_recomputed(pc, work), expert_load(model, pc, work)
    return [memory.memory_of_rank(model, run, precision, work.seq_len, work.microbatch_size, r,
                                  recomputed, load) for r in (range(pc.pp) if stages is None else stages)]


def fullest_stage(model: ModelConfig, pc: ParallelConfig, work: Workload,
                  precision: Precision = BF16_MIXED) -> int:
    """The pipeline rank whose total is largest (the first, on a tie): every rank holds its
    own layers, chunks and micro-batches in flight."""
    return _fullest_rank(model, pc, work, precision)[0]


def expert_load(model: ModelConfig, pc: ParallelConfig, work: Workload) -> float:
    """The busiest EP rank's routed tokens over the mean (`experts.busiest_rank_load`)."""
    return busiest_rank_load(model.moe_experts, pc.ep, work.moe_imbalance)


def memory_per_gpu(model: ModelConfig, pc: ParallelConfig, work: Workload,
                   precision: Precision = BF16_MIXED) -> dict[str, float]:
    """Bytes on the most loaded GPU: parameters, gradients, optimizer state (sharded over the
    dp x cp group by ZeRO stage) and stored activations, of the fullest pipeline rank."""
    return dict(_fullest_rank(model, pc, work, precision)[1])     # a copy: the kept one stays


# The planner asks for one layout's memory several times (its leanest setting first, then the
# cheapest that fits, then the estimate of that one): every argument is a frozen dataclass, so
# the answer is kept. 16,384 layouts: a few plans of 405B.
@functools.lru_cache(maxsize=2**14)
def _fullest_rank(model: ModelConfig, pc: ParallelConfig, work: Workload,
                  precision: Precision) -> tuple[int, dict[str, float]]:
    """(`fullest_stage`, its bytes)."""
    ranks = ranks_memory(model, pc, work, precision)
    totals = [r["total"] for r in ranks]
    stage = totals.index(max(totals))
    return stage, ranks[stage]
