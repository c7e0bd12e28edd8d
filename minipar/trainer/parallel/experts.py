"""Expert parallelism: the experts of each mixture-of-experts layer split over the ranks
of an EP group, and every token copy sent to the rank of its expert and back.

Chapter "Experts: the fifth axis". Rank r of an EP group of n holds experts
[r E/n, (r+1) E/n), placed Shard(0) on "ep" (`placement.py`). The reference `MoE` hands its
`experts` the token copies grouped by expert, counts[e] for expert e; `ExpertParallel` takes
the same and returns the same, in four steps:

    1. count exchange   an all-to-all of the counts: rank j learns how many copies each
                        rank will send to each of its experts (so it can size its buffers)
    2. dispatch         an uneven all-to-all of the copies: a rank's copies for rank j's
                        experts are contiguous (grouped by expert), so they go as one piece
    3. expert compute   what arrived is grouped by sender, then expert: regrouped by expert,
                        each local expert runs on its rows (`model.Experts`), and put back
    4. combine          the same all-to-all the other way: every output to its token's rank

The backward of each all-to-all is the all-to-all with the sizes swapped. Dropless: every
copy the router keeps is computed (the capacity rule, when asked for, is the reference's,
per sequence and expert, so it drops the same copies in every layout).

Expert weights are copies over the ranks that hold the same experts, the expert-data-
parallel group (`grid.edp`): their gradients are summed there, the others' over dp x cp
(`parallelize.data_parallel`). `balance_experts` moves DeepSeek-V3's routing bias by the
load of the whole batch.
"""

import torch
import torch.nn as nn

from .. import comm
from ..model import Experts, MoE
from ..placement import place, placements
from .tensor import shard_param


class _AllToAll(torch.autograd.Function):
    """Dispatch or combine; its backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, x, axis, send, recv):
        ctx.axis, ctx.send, ctx.recv = axis, send, recv
        return comm.all_to_all_uneven(x, axis, send, recv)

    @staticmethod
    def backward(ctx, g):
        return comm.all_to_all_uneven(g, ctx.axis, ctx.recv, ctx.send), None, None, None


class ExpertParallel(Experts):
    """This rank's experts of one MoE layer, and the all-to-alls that bring them their
    tokens. Its weights keep the reference's names (`experts.gate_proj`), cut along dim 0."""

    def __init__(self, experts: Experts, axis: comm.Axis):
        nn.Module.__init__(self)
        self.axis = axis
        for name, full in experts.named_parameters():
            mine = shard_param(full, axis, dim=0)
            for other, how in placements(full).items():     # a TP cut stays recorded
                place(mine, other, how)
            setattr(self, name, mine)

    def forward(self, x, counts):
        n, axis = self.axis.size, self.axis
        # 1. count exchange: mine[j, e] copies go to rank j's expert e; theirs[j, e] come
        #    from rank j to my expert e
        mine = counts.view(n, -1)
        theirs = comm.all_to_all_uneven(mine, axis, [1] * n, [1] * n)
        send, recv = mine.sum(1).tolist(), theirs.sum(1).tolist()
        # 2. dispatch
        rows = _AllToAll.apply(x, axis, send, recv)
        # 3. expert compute: the rows arrive by sender, then expert; each expert's together
        local = torch.arange(mine.shape[1], device=x.device).repeat(n)
        order = local.repeat_interleave(theirs.flatten()).argsort(stable=True)
        out = super().forward(rows[order], theirs.sum(0))
        # 4. combine: the outputs back in arrival order (the inverse permutation)
        return _AllToAll.apply(out[order.argsort()], axis, recv, send)


def apply_expert_parallel(model: nn.Module, axis: comm.Axis) -> nn.Module:
    """Split every MoE layer's experts of `model` (a chunk) over `axis`, in place."""
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        moe.experts = ExpertParallel(moe.experts, axis)
    return model


@torch.no_grad()
def balance_experts(chunks: list[nn.Module], axis: comm.Axis, rate: float):
    """After an optimizer step: each MoE layer's load (copies routed to each expert by this
    rank's micro-batches, counted in their backward) summed over `axis` (dp x cp: every
    token of the batch once), and its bias moved by `rate` towards balance: up for an expert
    below the mean load, down above it (DeepSeek-V3's update). Integers, summed exactly: every
    layout moves the same bias."""
    layers = [m for c in chunks for m in c.modules() if isinstance(m, MoE)]
    if rate and layers:
        load = comm.all_reduce(torch.stack([m.load for m in layers]), axis).double()
        for m, n in zip(layers, load):
            m.expert_bias += rate * torch.sign(n.mean() - n).to(m.expert_bias.dtype)
    for m in layers:
        m.load.zero_()
