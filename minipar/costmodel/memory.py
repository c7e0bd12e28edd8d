"""What the most loaded GPU holds: parameters, gradients, optimizer state, activations.

Chapter "MFU and communication volume" (and the data-parallel chapter for ZeRO's share). The
parts are the formulas' (`minipar.formulas`: layers per rank, parameters per rank,
activation elements, micro-batches in flight, ZeRO's bytes per parameter); this module adds
them up for each pipeline rank that could be the fullest and reports the largest.
"""
from __future__ import annotations

from ..config import ModelConfig, ParallelConfig
from ..formulas import (activation_elements, in_flight_microbatches, local_param_count,
                        rank_layers, zero_shards)
from .constants import BF16_MIXED, Precision
from .workload import Workload


def param_total_local(model: ModelConfig, tp: int) -> float:
    """Parameters of the whole model as one TP rank holds them (all stages together)."""
    return local_param_count(model, tp, model.n_layers, True, True)


def memory_of_rank(model: ModelConfig, pc: ParallelConfig, work: Workload,
                   precision: Precision, stage: int) -> dict[str, float]:
    """Bytes pipeline rank `stage` holds: {"params", "grads", "optimizer", "activations",
    "total"}; ZeRO shards the first three over the dp x cp group by its stage."""
    m, tokens = work.microbatches(pc), work.tokens_per_microbatch(pc)
    act = precision.act_bytes
    per_layer = activation_elements(model, pc.tp, pc.sp, work.recompute) * tokens * act
    layers = rank_layers(model, pc.pp, pc.virtual_stages, stage)
    params = local_param_count(model, pc.tp, layers, stage == 0, stage == pc.pp - 1)
    flight = in_flight_microbatches(pc.schedule, pc.pp, m, stage, pc.virtual_stages)
    acts = flight * layers * per_layer
    if work.recompute == "full":   # one layer's full activations while it is recomputed
        acts += activation_elements(model, pc.tp, pc.sp, "none") * tokens * act
    shards = zero_shards(pc.zero, pc.dp * pc.cp)
    out = {"params": params * precision.param_bytes / shards["params"],
           "grads": params * precision.grad_bytes / shards["grads"],
           "optimizer": params * precision.optimizer_bytes / shards["optimizer"]}
    out["activations"] = acts
    out["total"] = sum(out.values())
    return out


def memory_per_gpu(model: ModelConfig, parallel: ParallelConfig, work: Workload,
                   precision: Precision = BF16_MIXED) -> dict[str, float]:
    """Bytes on the most loaded GPU: parameters, gradients, optimizer state (sharded over the
    dp x cp group by ZeRO stage) and stored activations. The stage whose total is largest
    (usually the first: most micro-batches in flight) is reported."""
    pc = parallel
    # Layers differ by at most one between ranks (larger first) and in-flight micro-batches
    # fall with the rank, so the most loaded GPU is rank 0, rank 1 (rank 0 may hold only the
    # embedding) or the last (the head).
    ranks = sorted({0, min(1, pc.pp - 1), pc.pp - 1})
    return max((memory_of_rank(model, pc, work, precision, r) for r in ranks),
               key=lambda out: out["total"])
