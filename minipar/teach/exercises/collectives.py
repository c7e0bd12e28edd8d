"""The exercises of the collectives chapter, checked (see core.py for how)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...formulas import wire_bytes
from .core import Verdict, exercise, first_difference, number, on_ranks


@exercise("collectives", "number")
def check_ring_allreduce_bytes(n: int, size: int, answer) -> Verdict:
    """Bytes one rank sends in a ring all-reduce of `size` bytes over `n` ranks."""
    want = wire_bytes("all_reduce", n, size)
    return number(answer, want, "bytes sent per rank", rel=1e-6, hints=[
        (size, "that is the payload each rank hands in; count what the ring sends: a "
               "reduce-scatter phase and an all-gather phase."),
        ((n - 1) * size / n, "that is one phase (reduce-scatter or all-gather); an "
                             "all-reduce does both."),
        (2 * size, "close: each phase sends (n-1) chunks of size/n, not a whole size."),
    ])


def _allreduce_worker(fn):
    rank = dist.get_rank()
    t = torch.arange(6, dtype=torch.float32) * (rank + 1) + rank
    want = sum(torch.arange(6, dtype=torch.float32) * (r + 1) + r for r in range(2))
    real = dist.all_reduce

    def forbidden(*a, **k):
        raise RuntimeError("dist.all_reduce is not allowed here: build it from "
                           "dist.reduce_scatter_single and dist.all_gather_single")
    dist.all_reduce = forbidden
    try:
        got = fn(t.clone())
    finally:
        dist.all_reduce = real
    return first_difference(got, want, "the result")


@exercise("collectives", "implement")
def check_allreduce(fn) -> Verdict:
    """fn(t) -> the sum of t over all ranks, from a reduce-scatter and an all-gather."""
    return on_ranks(2, _allreduce_worker, fn,
        "reduce-scatter + all-gather is an all-reduce (on 2 gloo ranks, against the sum).")


__all__ = [n for n in dir() if n.startswith("check_")]
