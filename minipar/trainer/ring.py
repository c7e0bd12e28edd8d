"""The ring all-reduce written out with sends and receives: the algorithm behind the
2(n-1)/n bytes that every all-reduce in this book is charged.

Chapter "Collectives". Each of n ranks cuts its tensor into n chunks. In n-1 reduce-scatter
steps every rank passes one chunk to its right neighbour and adds the chunk that arrives
from its left; after them, rank r holds the complete sum of one chunk. In n-1 all-gather
steps the finished chunks go round once more. Each step sends S/n bytes per rank: 2(n-1)
steps, 2(n-1)/n S in all, which no rank-to-rank algorithm beats. `comm.all_reduce` hands
the same job to the backend (gloo, NCCL); this file exists to be read, run and checked
against it (tests/test_comm.py, the collectives notebook).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .comm import Axis, ring_exchange


def ring_schedule(n: int) -> tuple[list[list[int]], list[list[int]]]:
    """Which chunk each rank sends at each step of a ring all-reduce over n ranks:
    n-1 reduce-scatter steps, then n-1 all-gather steps. Rank r sends to r+1."""
    rs = [[(r - k - 1) % n for r in range(n)] for k in range(n - 1)]
    ag = [[(r - k) % n for r in range(n)] for k in range(n - 1)]
    return rs, ag


def ring_all_reduce(x: torch.Tensor, axis: Axis, axis_name: str = "ring by hand"):
    """The ring all-reduce written out with sends and receives, to see that its bytes are
    the formula's: each rank sends 2(n-1) chunks of S/n (`CommLog` files them under
    `axis_name`). Returns (the sum, this rank's slice of it: what a reduce-scatter alone
    would leave)."""
    n, r, ring = axis.size, axis.rank, replace(axis, log_as=axis_name)
    rs, ag = ring_schedule(n)
    chunks = [c.clone() for c in x.chunk(n)]
    for k in range(n - 1):              # reduce-scatter: add what arrives, pass it on
        (incoming,) = ring_exchange(ring, chunks[rs[k][r]]).wait()
        chunks[rs[k][(r - 1) % n]] += incoming
    mine = chunks[r].clone()            # complete: my slice of the sum
    for k in range(n - 1):              # all-gather: pass the finished slices round
        (arrived,) = ring_exchange(ring, chunks[ag[k][r]]).wait()
        chunks[ag[k][(r - 1) % n]] = arrived
    return torch.cat(chunks), mine
