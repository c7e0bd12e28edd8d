"""Collective matmul: sequence parallelism's all-gather and reduce-scatter, each cut into
t ring steps that hide behind a slice of the matmul they feed (or are fed by).

Chapter "Tensor parallelism", section "Hiding TP communication" (`--tp-overlap`).

Under sequence parallelism a column-parallel layer needs the whole sequence x, of which each
of the t ranks holds one chunk of s/t tokens: all-gather, *then* multiply, and the rank
waits for the gather. But the product of chunk c needs chunk c only. So go round the ring:

    all-gather, then matmul     step k = 0 .. t-1: rank r holds chunk (r - k) mod t;
                                 it passes it on to rank r + 1 (and receives chunk
                                 (r - k - 1) from rank r - 1) while it multiplies it.

The row-parallel layer's output is a partial sum that a reduce-scatter adds up, chunk c
ending on rank c. Turn that round too: a running sum visits every rank, each adding its
own part:

    matmul, then reduce-scatter step k = 0 .. t-1: rank r computes its part of chunk
                                 (r - k - 1) mod t while the running sum of that chunk
                                 arrives from rank r - 1; adds it; passes it on. At
                                 k = t - 1 the chunk is r's own, complete: it stays.

Either way t - 1 messages of one chunk, (t - 1)/t of the whole tensor: exactly the bytes
of the all-gather or reduce-scatter replaced. Nothing is saved on the wire; what changes is
that every transfer has a matmul to run behind. The backward of "all-gather, then matmul"
is "matmul, then reduce-scatter" (and the other way round), so these two loops are the
whole idea, forward and backward (JAX scaling book "collective matmul"; Wang et al. 2023;
Megatron's TP communication overlap; torchtitan's async TP).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .. import comm
from ..comm import Axis


# ----------------------------------------------------------------- the two ring loops
def gather_chunk(rank: int, t: int, k: int) -> int:
    """The chunk of x rank holds (and multiplies) at step k of all-gather-then-matmul."""
    return (rank - k) % t


def scatter_chunk(rank: int, t: int, k: int) -> int:
    """The output chunk whose part rank computes at step k of matmul-then-reduce-scatter:
    at k = t - 1 its own."""
    return (rank - k - 1) % t


def _pass_on(t: torch.Tensor, axis: Axis) -> comm.Handle:
    """Send `t` to the next rank of the ring, receive the previous rank's: in flight."""
    nxt, prv = axis.global_rank(axis.rank + 1), axis.global_rank(axis.rank - 1)
    return comm.exchange_async([(t, nxt)], [(torch.empty_like(t), prv)], axis_name=axis.log_as)


def all_gather_matmul(x_local: torch.Tensor, matmul: Callable, axis: Axis):
    """Every rank's chunk of x passes through `matmul(c, chunk_c)` as it goes round the
    ring; each transfer runs while the chunk already here is multiplied.
    Returns (the chunks in rank order, matmul's result for each chunk in rank order)."""
    t, r = axis.size, axis.rank
    chunks, results = [None] * t, [None] * t
    here = x_local.contiguous()
    for k in range(t):
        c = gather_chunk(r, t, k)
        chunks[c] = here                       # kept: it is being sent until wait()
        if k < t - 1:
            in_flight = _pass_on(here, axis)   # the next chunk travels ...
        results[c] = matmul(c, here)           # ... while this one is multiplied
        if k < t - 1:
            (here,) = in_flight.wait()
    return chunks, results


def matmul_reduce_scatter(part: Callable, axis: Axis) -> torch.Tensor:
    """The sum over ranks of chunk `axis.rank` of an output each rank holds a part of;
    `part(c)` computes this rank's part of chunk c, while the running sum of that chunk
    is on its way here."""
    t, r = axis.size, axis.rank
    running = part(scatter_chunk(r, t, 0))     # step 0: start the sum of chunk r - 1
    for k in range(1, t):
        in_flight = _pass_on(running, axis)    # the sum so far goes on ...
        mine = part(scatter_chunk(r, t, k))    # ... while I compute my part of the next
        (arrived,) = in_flight.wait()
        running = mine + arrived
    return running


# ----------------------------------------------------------------- the two layers' cores
def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., features] -> [tokens, features], for a weight gradient dW = dY^T X."""
    return t.reshape(-1, t.shape[-1])


class _AllGatherLinear(torch.autograd.Function):
    """Column-parallel under SP: x_r [b, s/t, h] -> y_i = X W_i^T [b, s, o_i] for every
    weight W_i of the layers that read the same input (q, k, v; gate, up), the all-gather
    of X hidden behind the products. X itself is returned too (not differentiable): the
    caller reads its shape, and the backward keeps it for dW_i = dY_i^T X."""

    @staticmethod
    def forward(ctx, x, axis, dim, *weights):
        chunks, results = all_gather_matmul(x, lambda c, xc: [F.linear(xc, w) for w in weights], axis)
        gathered = torch.cat(chunks, dim)
        ctx.save_for_backward(gathered, *weights)
        ctx.axis, ctx.dim = axis, dim
        ctx.mark_non_differentiable(gathered)
        return (gathered, *[torch.cat(ys, dim) for ys in zip(*results)])

    @staticmethod
    def backward(ctx, _, *dys):
        gathered, *weights = ctx.saved_tensors
        axis, dim = ctx.axis, ctx.dim

        def part(c):     # this rank's output features' share of dX, for chunk c
            return sum(dy.chunk(axis.size, dim)[c] @ w.to(dy.dtype) for dy, w in zip(dys, weights))
        dx = matmul_reduce_scatter(part, axis)
        dws = [(_rows(dy).T @ _rows(gathered).to(dy.dtype)).to(w.dtype) for dy, w in zip(dys, weights)]
        return (dx, None, None, *dws)


class _LinearReduceScatter(torch.autograd.Function):
    """Row-parallel under SP: x_r [b, s, f/t] -> this rank's chunk of sum_r x_r W_r^T
    [b, s/t, h], the reduce-scatter hidden behind the products."""

    @staticmethod
    def forward(ctx, x, weight, axis, dim):
        xs = x.chunk(axis.size, dim)
        out = matmul_reduce_scatter(lambda c: F.linear(xs[c], weight), axis)
        ctx.save_for_backward(x, weight)
        ctx.axis, ctx.dim = axis, dim
        return out

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        axis, dim = ctx.axis, ctx.dim
        xs = x.chunk(axis.size, dim)

        def grads(c, dyc):   # chunk c of dY arrives: its dX chunk and its share of dW
            return dyc @ w.to(dyc.dtype), _rows(dyc).T @ _rows(xs[c]).to(dyc.dtype)
        _, results = all_gather_matmul(dy, grads, axis)
        dx = torch.cat([dxc for dxc, _ in results], dim)
        dw = sum(dwc for _, dwc in results).to(w.dtype)
        return dx, dw, None, None


def all_gather_linear(x_local, weights, axis: Axis, dim: int):
    """(the gathered X, [X W^T for each W in weights]) with the all-gather overlapped."""
    gathered, *ys = _AllGatherLinear.apply(x_local, axis, dim, *weights)
    return gathered, ys


def linear_reduce_scatter(x, weight, axis: Axis, dim: int):
    """This rank's chunk (along `dim`) of the sum over ranks of x W^T, overlapped."""
    return _LinearReduceScatter.apply(x, weight, axis, dim)
