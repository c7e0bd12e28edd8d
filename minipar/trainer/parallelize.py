"""One function, one order: build this rank's piece of the model from the reference Llama.

Chapter "Four dimensions at once". Every axis transforms the single-device model; none
builds a model of its own. `parallelize` applies them in a fixed order, each step reading
the one before:

    1. pipeline split   which layers this rank holds: one chunk, or one per virtual stage
    2. tensor parallel  each chunk's matrices split over the TP group (`TP_PLAN`)
    3. context parallel each attention core swapped for ring, all-gather or Ulysses attention
    4. expert parallel  each MoE layer's experts split over the EP group, their tokens sent
                        to them and back by all-to-alls
    5. recompute        each block (full) or attention core (selective) runs again in
                        the backward instead of keeping its activations; after CP, so
                        that selective wraps the ring or all-gather attention
    6. data parallel    the gradients of everything this rank holds reduced over dp x cp
                        (an expert's over the ranks holding the same experts), plainly or
                        with ZeRO stage 1, 2 or 3

Weights are initialised by parameter name and seed before any split, so whatever the
layout, the pieces hold exactly the single-device weights.
"""

from typing import Callable, NamedTuple

import torch
import torch.nn as nn

from ..plan.config import ModelConfig, ParallelConfig
from .grid import ProcessGrid
from .model import Transformer, cross_entropy_sum
from .parallel.context import apply_context_parallel
from .parallel.data import DataParallel
from .parallel.experts import apply_expert_parallel
from .parallel.pipeline import build_stage_modules, tied_gradient_sync
from .parallel.tensor import (apply_tensor_parallel, sum_partial_grads,
                              vocab_parallel_cross_entropy_sum)
from .parallel.zero import ZERO_STAGES
from .recompute import apply_recompute


class ParallelModel(NamedTuple):
    """What `parallelize` returns: this rank's chunks, their gradient synchroniser, and
    the loss that matches how the chunks hold the logits."""

    chunks: list[nn.Module]
    dp: DataParallel
    loss_fn: Callable


def parallelize(mcfg: ModelConfig, pcfg: ParallelConfig, grid: ProcessGrid, seed: int,
                device: torch.device | str = "cpu") -> ParallelModel:
    """This rank's model under layout `pcfg`. Collective: every rank calls it."""
    chunks = ([Transformer(mcfg, seed=seed)] if pcfg.pp == 1         # 1. pipeline split
              else build_stage_modules(mcfg, pcfg, grid, seed))
    if pcfg.tp > 1:                                                  # 2. tensor parallel
        chunks = [apply_tensor_parallel(m, grid.tp, sp=pcfg.sp, overlap=pcfg.tp_overlap)
                  for m in chunks]
    if pcfg.cp > 1:                                                  # 3. context parallel
        chunks = [apply_context_parallel(m, grid.cp, impl=pcfg.cp_impl) for m in chunks]
    if pcfg.ep > 1:                                                  # 4. expert parallel
        chunks = [apply_expert_parallel(m, grid.ep) for m in chunks]
    chunks = [apply_recompute(m, pcfg.recompute).to(device) for m in chunks]   # 5. recompute
    dp = data_parallel(chunks, grid, pcfg)                            # 6. data parallel
    # after the reduction: the TP-partial gradients (SP's norms, routers), then a tied
    # embedding's copies
    partial = (lambda grads: sum_partial_grads(grads, grid.tp)) if pcfg.tp > 1 else None
    dp.after_reduce += [s for s in (partial, tied_gradient_sync(chunks)) if s is not None]
    # the loss of this rank's logits: under TP from its vocabulary slice (never gathered)
    loss_fn = ((lambda logits, y: vocab_parallel_cross_entropy_sum(logits, y, grid.tp))
               if pcfg.tp > 1 else cross_entropy_sum)
    return ParallelModel(chunks, dp, loss_fn)


def data_parallel(chunks: list[nn.Module], grid: ProcessGrid, pcfg: ParallelConfig) -> DataParallel:
    """Wrap the chunks for gradient synchronisation over dp x cp: context-parallel ranks
    hold the same weights and see other tokens, so for gradients they are data-parallel.
    Stage 0 is plain `DataParallel`; ZeRO-3 gathers the units `zero3_units` names. An
    expert's copies are on the expert-data-parallel ranks: its gradient is summed there."""
    return ZERO_STAGES[pcfg.zero](chunks, grid.dp_cp, bucket_mb=pcfg.bucket_mb,
                                  axis_of=grid.data_axis)
