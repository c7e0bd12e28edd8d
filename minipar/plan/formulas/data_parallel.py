"""The bytes data parallelism and ZeRO send per step, and when the buckets' all-reduces end.

Chapter "Data parallelism". Torch-free, like every file of `minipar.plan.formulas`. What
each ZeRO stage shards, and so keeps per parameter, is a count of bytes held:
`formulas.memory.zero_shards`, with the rest of the memory model's formulas.
"""
from __future__ import annotations

import math

from ..config import ZERO_STAGES, ConfigError, unknown
from .collective_time import all_reduce_time
from .collectives import wire_bytes


def dp_bytes(n_params: int, n: int, zero: int, microbatches: int = 1,
             grad_bytes: int = 4, param_bytes: int = 4) -> int:
    """Data-parallel bytes one GPU sends per step, over the dp x cp group of size n.

    n_params: the parameters this rank holds (its TP shard of its pipeline stage).
      zero 0  all-reduce the accumulated gradients once, after the last micro-batch:
              2(n-1)/n G
      zero 1  reduce-scatter them once, update my shard, all-gather the parameters:
              (n-1)/n G + (n-1)/n P
      zero 2  as 1, but reduce-scatter after *every* micro-batch (no full gradient is kept):
              m (n-1)/n G + (n-1)/n P
      zero 3  per micro-batch: all-gather the parameters for the forward, again for the
              backward, reduce-scatter the gradients: m [2 (n-1)/n P + (n-1)/n G]
    with G = n_params * grad_bytes, P = n_params * param_bytes (equal on CPU: float32).
    minipar pads every tensor to a multiple of n for ZeRO >= 1; pass the padded count
    (`zero_padded_numel`) to match its CommLog to the byte.
    """
    g, p, m = n_params * grad_bytes, n_params * param_bytes, microbatches
    if zero == 0:
        return wire_bytes("all_reduce", n, g)
    if zero == 1:
        return wire_bytes("reduce_scatter", n, g) + wire_bytes("all_gather", n, p)
    if zero == 2:
        return m * wire_bytes("reduce_scatter", n, g) + wire_bytes("all_gather", n, p)
    if zero == 3:
        return m * (2 * wire_bytes("all_gather", n, p) + wire_bytes("reduce_scatter", n, g))
    raise ConfigError(unknown("--zero", zero, ZERO_STAGES))


def bucket_timeline(bucket_bytes, ready_s, n: int, alpha: float,
                    bandwidth: float) -> list[tuple[float, float]]:
    """(start, end) of each bucket's all-reduce when bucket i can be launched at ready_s[i]
    (the naive version: every bucket when the backward ends) and one link carries them one after
    another, each taking all_reduce_time. The step's gradients are summed at the last end."""
    spans, free = [], 0.0
    for size, ready in zip(bucket_bytes, ready_s):
        start = max(ready, free)
        free = start + all_reduce_time(size, n, alpha, bandwidth)
        spans.append((start, free))
    return spans


def zero_padded_numel(numels, n: int) -> int:
    """Elements ZeRO moves for tensors of `numels` elements: each padded to a multiple of n."""
    return sum(math.ceil(k / n) * n for k in numels)
