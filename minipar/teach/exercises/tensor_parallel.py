"""The exercises of the tensor parallelism chapter, checked (see core.py for how)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...formulas import wire_bytes
from .core import Verdict, exercise, first_difference, number, on_ranks


@exercise("tensor_parallel", "number")
def check_tp_allreduce_bytes(tp: int, b: int, s: int, h: int, bytes_per_elem: int, answer) -> Verdict:
    """Wire bytes per rank of the one all-reduce after a row-parallel layer: [b, s, h]."""
    size = b * s * h * bytes_per_elem
    want = wire_bytes("all_reduce", tp, size)
    return number(answer, want, "bytes sent per rank", rel=1e-6, hints=[
        (size, "that is the activation's size; the ring all-reduce sends 2(n-1)/n of it."),
        (size / tp, "the partial sums are full-size [b, s, h] on every rank, not 1/tp of it."),
    ])


def _column_parallel_worker(fn):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, w = torch.randn(3, 5), torch.randn(8, 5)       # nn.Linear's layout: [out, in]
    shard = w.chunk(n, dim=0)[rank].clone()
    return first_difference(fn(x, shard), x @ w.T, "column_parallel(x, w_shard)")


@exercise("tensor_parallel", "implement")
def check_column_parallel(fn) -> Verdict:
    """fn(x, w_shard) -> x @ W.T, where this rank holds rows `w_shard` of W (dim 0 split)."""
    return on_ranks(2, _column_parallel_worker, fn,
        "your column-parallel linear matches x @ W.T on 2 gloo ranks.")


__all__ = [n for n in dir() if n.startswith("check_")]
