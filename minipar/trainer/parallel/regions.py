"""Entering and leaving a tensor-parallel region: collectives that autograd understands.

Chapter "Tensor parallelism". Megatron-LM (Shoeybi et al. 2019) builds a block from two
conjugate operators:

    f   forward identity         backward all-reduce   (the input is whole on every rank;
                                                        each rank's gradient is a part)
    g   forward all-reduce       backward identity     (the outputs are partial sums)

Sequence parallelism (Korthikanti et al. 2022) replaces them with a pair that keeps the
activations between blocks sharded along the sequence:

    gather_from_group          forward all-gather      backward reduce-scatter
    reduce_scatter_to_group    forward reduce-scatter  backward all-gather

Each is an `autograd.Function` whose backward is the forward's transpose; every byte goes
through `comm`, so CommLog counts it. Context parallelism's all-gather of K/V reuses
`gather_from_group`; its Ulysses variant uses `all_to_all`, whose transpose is the
all-to-all with the two dimensions swapped.
"""

import torch

from .. import comm


class _CopyToGroup(torch.autograd.Function):
    """Megatron's f: forward identity, backward all-reduce (input replicated, grads partial)."""

    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return comm.all_reduce(g.contiguous().clone(), ctx.axis), None


class _ReduceFromGroup(torch.autograd.Function):
    """Megatron's g: forward all-reduce (partial sums), backward identity."""

    @staticmethod
    def forward(ctx, x, axis):
        return comm.all_reduce(x.contiguous().clone(), axis)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromGroup(torch.autograd.Function):
    """Forward all-gather along `dim`; backward reduce-scatter (each rank's slice of the
    summed gradient). Sequence parallelism's entry into a column-parallel block."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return comm.all_gather(x, axis, dim)

    @staticmethod
    def backward(ctx, g):
        return comm.reduce_scatter(g, ctx.axis, ctx.dim), None, None


class _ReduceScatterToGroup(torch.autograd.Function):
    """Forward reduce-scatter along `dim`; backward all-gather. Sequence parallelism's exit
    from a row-parallel block: partial sums become this rank's slice of the total."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return comm.reduce_scatter(x, axis, dim)

    @staticmethod
    def backward(ctx, g):
        return comm.all_gather(g, ctx.axis, ctx.dim), None, None


class _AllToAll(torch.autograd.Function):
    """Forward: split `split_dim` over the ranks, concatenate what arrives along
    `concat_dim`. Backward: the same exchange the other way (dims swapped)."""

    @staticmethod
    def forward(ctx, x, axis, split_dim, concat_dim):
        ctx.axis, ctx.way_back = axis, (concat_dim, split_dim)
        return comm.all_to_all(x, axis, split_dim, concat_dim)

    @staticmethod
    def backward(ctx, g):
        return comm.all_to_all(g, ctx.axis, *ctx.way_back), None, None, None


def copy_to_group(x, axis: comm.Axis):
    return x if axis.size == 1 else _CopyToGroup.apply(x, axis)


def reduce_from_group(x, axis: comm.Axis):
    return x if axis.size == 1 else _ReduceFromGroup.apply(x, axis)


def gather_from_group(x, axis: comm.Axis, dim: int):
    return x if axis.size == 1 else _GatherFromGroup.apply(x, axis, dim)


def reduce_scatter_to_group(x, axis: comm.Axis, dim: int):
    return x if axis.size == 1 else _ReduceScatterToGroup.apply(x, axis, dim)


def all_to_all(x, axis: comm.Axis, split_dim: int, concat_dim: int):
    return x if axis.size == 1 else _AllToAll.apply(x, axis, split_dim, concat_dim)
