"""Test hooks: what the tests read from inside a run, kept out of the teaching files.

Chapter "From a laptop to a cluster" (it runs inside the loop), for every axis chapter's
proof: a layout is right when its gradients are the single device's. `capture_grads` is an
`after_backward` hook (`run.train(cfg, after_backward=capture_grads)`) that returns them after
the first step's backward; nothing in the package imports this module.
"""
from __future__ import annotations

import math

import torch

from ..trainer import comm


def full_grads(chunks, dp) -> dict[str, torch.Tensor]:
    """Each parameter's gradient as this rank's model piece holds it: TP- and PP-local,
    whole over data parallelism. ZeRO pieces (each rank holds elements start:stop of the
    flattened gradient) are put back together over the group that reduced them (dp x cp, or
    for an expert under EP its expert-data-parallel group): every rank places its piece in
    zeros and the pieces, disjoint, are summed. Not counted in CommLog."""
    held = {id(p): g for g, p in dp.grads()}
    out = {}
    with comm.paused():
        for m in chunks:
            for name, p in m.named_parameters():
                if id(p) in held:
                    out[name] = _whole(held[id(p)], p, dp)
    return out


def _whole(g: torch.Tensor, p, dp) -> torch.Tensor:
    if dp.holds_replicas:
        return g.detach().clone()
    shard = dp.shard_of(p)
    flat = g.new_zeros(math.prod(shard.shape))
    flat[shard.start:shard.stop] = g.detach().reshape(-1)
    return comm.all_reduce(flat, dp.bucket_of[p].axis).view(shard.shape)


def capture_grads(step: int, chunks, dp, grid) -> dict[str, torch.Tensor] | None:
    """The `after_backward` hook: every gradient after step 0's backward."""
    return full_grads(chunks, dp) if step == 0 else None
