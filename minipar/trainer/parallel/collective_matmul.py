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

At the end, the layers that the TP plan picks under `--tp-overlap` (`tensor.OVERLAP_STYLES`)
in place of plain tensor parallelism's: `AllGatherLinears`, a block's q, k, v (or gate,
up) in one ring trip, standing in for the reference model's seam `Attention.qkv` (or
`MLP.gate_up`); `CollectiveColumnParallelLinear`, the output head; and
`CollectiveRowParallelLinear`. They compute with the weights `tensor.py` split, unchanged.
"""

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm

SEQ_DIM = 1   # activations are [batch, sequence, hidden]; SP shards dimension 1


# ----------------------------------------------------------------- the two ring loops
def gather_chunk(rank: int, t: int, k: int) -> int:
    """The chunk of x rank holds (and multiplies) at step k of all-gather-then-matmul."""
    return (rank - k) % t


def scatter_chunk(rank: int, t: int, k: int) -> int:
    """The output chunk whose part rank computes at step k of matmul-then-reduce-scatter:
    at k = t - 1 its own."""
    return (rank - k - 1) % t


def all_gather_matmul(x_local: torch.Tensor, matmul: Callable, axis: comm.Axis):
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
            in_flight = comm.ring_exchange(axis, here)   # the next chunk travels ...
        results[c] = matmul(c, here)                     # ... while this one is multiplied
        if k < t - 1:
            (here,) = in_flight.wait()
    return chunks, results


def matmul_reduce_scatter(part: Callable, axis: comm.Axis) -> torch.Tensor:
    """The sum over ranks of chunk `axis.rank` of an output each rank holds a part of;
    `part(c)` computes this rank's part of chunk c, while the running sum of that chunk
    is on its way here."""
    t, r = axis.size, axis.rank
    running = part(scatter_chunk(r, t, 0))     # step 0: start the sum of chunk r - 1
    for k in range(1, t):
        in_flight = comm.ring_exchange(axis, running)   # the sum so far goes on ...
        mine = part(scatter_chunk(r, t, k))             # ... while I compute my part of the next
        (arrived,) = in_flight.wait()
        running = mine + arrived
    return running


# ----------------------------------------------------------------- the two layers' cores
# Each layer's backward runs the other loop: the gradient of "all-gather, then matmul" is
# "matmul, then reduce-scatter", and the other way round.
def _weight_grad(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dW = dY^T X summed over every token ([..., out] and [..., in] -> [out, in]), in W's
    dtype (under autocast dY may be narrower than the saved X)."""
    return (dy.flatten(0, -2).T @ x.flatten(0, -2).to(dy.dtype)).to(w.dtype)


class _AllGatherLinear(torch.autograd.Function):
    """Column-parallel under SP: x_r [b, s/t, h] -> y_i = X W_i^T [b, s, o_i] for every
    weight W_i of the layers that read the same input (q, k, v; gate, up), the all-gather
    of X hidden behind the products. The backward keeps X for dW_i = dY_i^T X."""

    @staticmethod
    def forward(ctx, x, axis, *weights):
        chunks, ys = all_gather_matmul(x, lambda c, xc: [F.linear(xc, w) for w in weights], axis)
        ctx.save_for_backward(torch.cat(chunks, SEQ_DIM), *weights)
        ctx.axis = axis
        return tuple(torch.cat(y, SEQ_DIM) for y in zip(*ys))

    @staticmethod
    def backward(ctx, *dys):
        gathered, *weights = ctx.saved_tensors
        t = ctx.axis.size

        def part(c):     # this rank's output features' share of dX, for chunk c
            return sum(dy.chunk(t, SEQ_DIM)[c] @ w.to(dy.dtype) for dy, w in zip(dys, weights))
        dx = matmul_reduce_scatter(part, ctx.axis)
        return (dx, None, *[_weight_grad(dy, gathered, w) for dy, w in zip(dys, weights)])


class _LinearReduceScatter(torch.autograd.Function):
    """Row-parallel under SP: x_r [b, s, f/t] -> this rank's chunk of sum_r x_r W_r^T
    [b, s/t, h], the reduce-scatter hidden behind the products. The backward all-gathers
    dY behind dX = dY W, chunk by chunk, and keeps the gathered dY for dW = dY^T x_r."""

    @staticmethod
    def forward(ctx, x, weight, axis):
        ctx.save_for_backward(x, weight)
        ctx.axis = axis
        xs = x.chunk(axis.size, SEQ_DIM)
        return matmul_reduce_scatter(lambda c: F.linear(xs[c], weight), axis)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        chunks, dxs = all_gather_matmul(dy, lambda c, dyc: dyc @ w.to(dyc.dtype), ctx.axis)
        return torch.cat(dxs, SEQ_DIM), _weight_grad(torch.cat(chunks, SEQ_DIM), x, w), None


# ----------------------------------------------------------------- the layers the TP plan picks
# Under `--tp-overlap` the plan (`tensor.OVERLAP_STYLES`) splits the weights as without it,
# then computes with them here: each block enters the TP region through one collective
# matmul of its input projections, each row-parallel layer leaves through the other.


class AllGatherLinears:
    """Column-parallel layers that read one sequence-sharded input (q, k, v; gate, up; or the
    head alone), all computed in one trip round the ring: each chunk of the sequence is
    multiplied by every layer's weight as it goes by. It owns no parameter: the layers keep
    theirs, and their names."""

    def __init__(self, linears, axis: comm.Axis):
        self.linears, self.axis = list(linears), axis

    def __call__(self, x):
        ys = _AllGatherLinear.apply(x, self.axis, *[m.weight for m in self.linears])
        return tuple(y if m.bias is None else y + m.bias for m, y in zip(self.linears, ys))


# The reference model's seams through which a block's input meets its column-parallel
# layers (`Attention.qkv`, `MLP.gate_up`), with those layers in the order the seam returns them.
INPUT_PROJECTIONS = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}


def enter_by_collective_matmul(block: nn.Module, axis: comm.Axis, sp: bool) -> nn.Module:
    """The plan's "enter" under `--tp-overlap`: rather than all-gather the block's input and
    then multiply, the block's seam becomes one `AllGatherLinears` of its (already split)
    projections. One trip round the ring serves q, k and v, where one all-gather did."""
    for seam, names in INPUT_PROJECTIONS.items():
        if hasattr(block, seam):
            setattr(block, seam, AllGatherLinears([getattr(block, n) for n in names], axis))
    return block


class CollectiveColumnParallelLinear(nn.Module):
    """The output head under `--tp-overlap`: column-parallel, entering the TP region by
    itself, its all-gather hidden behind its matmul. It takes over the shards of a
    `ColumnParallelLinear`."""

    def __init__(self, col: nn.Module, axis: comm.Axis):
        super().__init__()
        self.axis, self.weight, self.bias = axis, col.weight, col.bias

    def forward(self, x):
        return AllGatherLinears([self], self.axis)(x)[0]


class CollectiveRowParallelLinear(nn.Module):
    """A row-parallel layer under `--tp-overlap`: its reduce-scatter hidden behind its
    matmul, chunk by chunk. It takes over the shards of a `RowParallelLinear` (the bias,
    replicated, is added after the sum)."""

    def __init__(self, row: nn.Module):
        super().__init__()
        self.axis, self.weight, self.bias = row.axis, row.weight, row.bias

    def forward(self, x):
        y = _LinearReduceScatter.apply(x, self.weight, self.axis)
        return y if self.bias is None else y + self.bias
