"""What the most loaded GPU holds: parameters, gradients, optimizer state, activations.

Chapter "Memory: where every byte goes" (and the data-parallel chapter for ZeRO's share).
The parts are the formulas' (`minipar.plan.formulas`: layers per rank, parameters per rank,
saved elements per token and layer, micro-batches in flight per chunk, ZeRO's shards); this
module adds them up for each pipeline rank that could be the fullest and reports the
largest.

Two accountings of activations, one per precision, because they describe two programs:
* FP32 is minipar on a CPU: the eager PyTorch code of `minipar.trainer.model`, tensor by tensor
  (`formulas.layer_saved_elements` and friends). `tests/test_memory.py` checks it against
  what `minipar.trainer.memory_meter.ActivationMeter` measures, within 5%.
* BF16_MIXED is Llama 3 on H100s: fused kernels (flash attention, fused norm and SwiGLU),
  Korthikanti et al.'s accounting (`formulas.activation_elements`), plus the whole
  sequence's K/V that all-gather context parallelism keeps.
"""
from __future__ import annotations

from ..config import ModelConfig, ParallelConfig
from ..formulas.memory import (activation_elements, embedding_saved_bytes, head_saved_bytes,
                               layer_saved_elements, rope_saved_elements,
                               weight_pass_kept_elements)
from ..flops import local_param_count
from ..formulas.pipeline_parallel import in_flight_chunks
from ..schedules import rank_layers, stage_layer_counts
from ..formulas.data_parallel import zero_shards
from .constants import BF16_MIXED, FP32, Precision
from .workload import Workload


def param_total_local(model: ModelConfig, tp: int) -> float:
    """Parameters of the whole model as one TP rank holds them (all stages together)."""
    return local_param_count(model, tp, model.n_layers, True, True)


def recompute_of(pc: ParallelConfig, work: Workload) -> str:
    """The recompute mode: the workload's (the cost model's flag), else the layout's
    (`ParallelConfig.recompute`, the trainer's flag)."""
    return work.recompute if work.recompute != "none" else pc.recompute


def layer_bytes(model: ModelConfig, pc: ParallelConfig, precision: Precision,
                recompute: str) -> float:
    """Bytes per token one transformer layer keeps for the backward on one GPU."""
    if precision == FP32:
        return layer_saved_elements(model, pc.tp, pc.sp, pc.cp, pc.cp_impl, recompute) * 4
    elements = activation_elements(model, pc.tp, pc.sp, recompute)
    if pc.cp > 1 and pc.cp_impl == "allgather" and recompute == "none":
        elements += 2 * model.n_kv_heads * model.head_dim * (pc.cp - 1) / pc.tp
    return elements * precision.act_bytes


def activation_bytes(model: ModelConfig, pc: ParallelConfig, work: Workload,
                     precision: Precision, stage: int) -> float:
    """Peak bytes of activations on pipeline rank `stage`: each chunk's in-flight
    micro-batches times what its layers keep (+ RoPE's tables, the embedding's ids and the
    head's softmax where they live), plus, under full recompute, one layer recomputed."""
    v, tokens = pc.virtual_stages, work.tokens_per_microbatch(pc)
    recompute = recompute_of(pc, work)
    flight = in_flight_chunks(pc.schedule, pc.pp, work.microbatches(pc), stage, v)
    layers = stage_layer_counts(model.n_layers, pc.pp * v)
    per_layer = layer_bytes(model, pc, precision, recompute) * tokens
    acts = sum(n * layers[c * pc.pp + stage] * per_layer for c, n in enumerate(flight))
    head = 0.0
    if precision == FP32:         # the small parts the eager code keeps besides the layers
        acts += sum(flight) * rope_saved_elements(model, work.seq_len // pc.cp) * 4
        if stage == 0:
            acts += flight[0] * embedding_saved_bytes(tokens, pc.tp)
        if stage == pc.pp - 1:
            head = head_saved_bytes(model, tokens, pc.tp, pc.sp)
            acts += flight[-1] * head
    if recompute == "full":
        # a backward frees the head's tensors before it recomputes the first block (except
        # zero-bubble's W: B kept the whole graph)
        freed = 0.0 if pc.pp > 1 and pc.schedule == "zb" else head
        acts += max(0.0, recompute_transient(model, pc, precision, tokens) - freed)
    return acts


def recompute_transient(model: ModelConfig, pc: ParallelConfig, precision: Precision,
                        tokens: int) -> float:
    """Full recompute: while a block's backward runs, everything it saves is back (its
    input is already there): one layer's worth.

    Zero-bubble's W is different: it reruns each block of the chunk and frees only what the
    weight gradients read (the two norms' outputs and the inputs of the linears); the rest of
    every block it recomputed stays until the chunk's W is done. So: one block whole, and
    what W leaves of the chunk's other blocks (`formulas.weight_pass_kept_elements`)."""
    once = (layer_bytes(model, pc, precision, "none") - layer_bytes(model, pc, precision, "full")) * tokens
    if pc.pp == 1 or pc.schedule != "zb" or precision != FP32:
        return once
    chunk_layers = max(stage_layer_counts(model.n_layers, pc.pp * pc.virtual_stages))
    left = weight_pass_kept_elements(model, pc.tp, pc.sp, pc.cp, pc.cp_impl) * 4 * tokens
    return once + (chunk_layers - 1) * left


def memory_of_rank(model: ModelConfig, pc: ParallelConfig, work: Workload,
                   precision: Precision, stage: int) -> dict[str, float]:
    """Bytes pipeline rank `stage` holds: {"params", "grads", "optimizer", "activations",
    "total"}; ZeRO shards the first three over the dp x cp group by its stage."""
    layers = rank_layers(model, pc.pp, pc.virtual_stages, stage)
    params = local_param_count(model, pc.tp, layers, stage == 0, stage == pc.pp - 1)
    shards = zero_shards(pc.zero, pc.dp * pc.cp)
    out = {"params": params * precision.param_bytes / shards["params"],
           "grads": params * precision.grad_bytes / shards["grads"],
           "optimizer": params * precision.optimizer_bytes / shards["optimizer"],
           "activations": activation_bytes(model, pc, work, precision, stage)}
    out["total"] = sum(out.values())
    return out


def memory_per_gpu(model: ModelConfig, parallel: ParallelConfig, work: Workload,
                   precision: Precision = BF16_MIXED) -> dict[str, float]:
    """Bytes on the most loaded GPU: parameters, gradients, optimizer state (sharded over the
    dp x cp group by ZeRO stage) and stored activations. Every pipeline rank is weighed
    (each holds its own layers, chunks and micro-batches in flight) and the fullest is
    reported (`fullest_stage` says which)."""
    return memory_of_rank(model, parallel, work, precision,
                          fullest_stage(model, parallel, work, precision))


def fullest_stage(model: ModelConfig, parallel: ParallelConfig, work: Workload,
                  precision: Precision = BF16_MIXED) -> int:
    """The pipeline rank whose total is largest (the first, on a tie)."""
    totals = [memory_of_rank(model, parallel, work, precision, r)["total"]
              for r in range(parallel.pp)]
    return totals.index(max(totals))
