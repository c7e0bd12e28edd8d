"""One function, one order: build this rank's piece of the model from the reference Llama.

Chapter "Four dimensions at once". Every axis transforms the single-device model; none
builds a model of its own. `parallelize` applies them in a fixed order, each step reading
the one before:

    1. pipeline split   which layers this rank holds: one chunk, or one per virtual stage
    2. tensor parallel  each chunk's matrices split over the TP group (`TP_PLAN`)
    3. context parallel each attention core swapped for ring, all-gather or Ulysses attention
    4. recompute        each block (full) or attention core (selective) runs again in
                        the backward instead of keeping its activations; after CP, so
                        that selective wraps the ring or all-gather attention
    5. data parallel    the gradients of everything this rank holds reduced over dp x cp,
                        plainly or with ZeRO stage 1, 2 or 3

Weights are initialised by parameter name and seed before any split, so whatever the
layout, the pieces hold exactly the single-device weights.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn as nn

from .config import ModelConfig, ParallelConfig
from .grid import ProcessGrid
from .model import Transformer, cross_entropy_sum
from .parallel.context import apply_context_parallel
from .parallel.data import DataParallel
from .parallel.pipeline import build_stage_modules, tied_gradient_sync
from .parallel.tensor import (apply_tensor_parallel, sum_partial_grads,
                              vocab_parallel_cross_entropy_sum)
from .parallel.zero import ZERO_STAGES, ZeRO3
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
    if pcfg.pp > 1:                                                  # 1. pipeline split
        chunks = build_stage_modules(mcfg, pcfg, grid, seed)
    else:
        chunks = [Transformer(mcfg, seed=seed)]
    if pcfg.tp > 1:                                                  # 2. tensor parallel
        chunks = [apply_tensor_parallel(m, grid.tp, sp=pcfg.sp, overlap=pcfg.tp_overlap)
                  for m in chunks]
    if pcfg.cp > 1:                                                  # 3. context parallel
        chunks = [apply_context_parallel(m, grid.cp, impl=pcfg.cp_impl) for m in chunks]
    if pcfg.recompute != "none":                                     # 4. recompute
        chunks = [apply_recompute(m, pcfg.recompute) for m in chunks]
    chunks = [m.to(device) for m in chunks]
    dp = data_parallel(chunks, grid, pcfg)                            # 5. data parallel
    # after the reduction: the TP-partial gradients (SP's norms), then a tied embedding's copies
    dp.after_reduce += [s for s in (sum_partial_grads if pcfg.sp else None,
                                    tied_gradient_sync(chunks)) if s is not None]
    return ParallelModel(chunks, dp, loss_function(pcfg, grid))


def data_parallel(chunks: list[nn.Module], grid: ProcessGrid, pcfg: ParallelConfig) -> DataParallel:
    """Wrap the chunks for gradient synchronisation over dp x cp: context-parallel ranks
    hold the same weights and see other tokens, so for gradients they are data-parallel."""
    if pcfg.zero == 3:
        return ZeRO3(chunks, grid.dp_cp, bucket_mb=pcfg.bucket_mb, units=zero3_units(chunks))
    stage = DataParallel if pcfg.zero == 0 else ZERO_STAGES[pcfg.zero]
    return stage(chunks, grid.dp_cp, bucket_mb=pcfg.bucket_mb)


def zero3_units(chunks: list[nn.Module]) -> list[nn.Module]:
    """The modules ZeRO-3 gathers one at a time: the embedding, each block, norm, head."""
    units = []
    for m in chunks:
        units += [u for u in (m.embed_tokens, *m.layers.values(), m.norm, m.lm_head) if u is not None]
    return units


def loss_function(pcfg: ParallelConfig, grid: ProcessGrid) -> Callable:
    """The sum of token losses of this rank's logits: from its vocabulary slice under TP
    (the logits are never gathered), else the plain cross-entropy."""
    if pcfg.tp > 1:
        return lambda logits, y: vocab_parallel_cross_entropy_sum(logits, y, grid.tp)
    return cross_entropy_sum
