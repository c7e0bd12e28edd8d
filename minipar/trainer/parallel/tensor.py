"""Tensor parallelism: every weight matrix of a layer split over the t ranks of one server.

Chapter "Tensor parallelism".

Megatron-LM's layout (Shoeybi et al. 2019). A linear layer y = x A^T can be split two ways:

    column-parallel   rank r holds rows r of A (a slice of the *output* features):
                      y_r = x A_r^T needs the whole x and yields a slice of y.
    row-parallel      rank r holds columns r of A (a slice of the *input* features):
                      y = sum_r x_r A_r^T needs a slice of x and yields a partial sum of y.

Put a column-parallel layer first and a row-parallel one second, and the slice the first
produces is exactly the slice the second consumes: attention splits its heads (q, k, v
column-parallel, o row-parallel; grouped-query K/V heads are split too), the MLP its hidden
units (gate, up column-parallel, down row-parallel). Each block then needs one collective in
and one out, Megatron's conjugate pair from `regions`:

    f  enter   forward identity      backward all-reduce   (x is whole on every rank)
    g  exit    forward all-reduce    backward identity     (the partial sums add up)

Sequence parallelism (`sp`, Korthikanti et al. 2022) notices that between the blocks, where
norms and residual adds run on a *replicated* activation, every rank does the same work on
the same [b, s, h] tensor. Shard it along the sequence instead: f becomes an all-gather of
the sequence and g a reduce-scatter. An all-reduce *is* a reduce-scatter followed by an
all-gather, so the bytes on the wire are the same; the norms and residuals now cost 1/t.

The embedding and the output head are split along the vocabulary (Llama 3's 128K rows are
2 GB in bf16), and the loss is computed from each rank's slice of the logits without ever
gathering them: `vocab_parallel_cross_entropy_sum`.

`apply_tensor_parallel` turns the reference model into this, in place, by the table
`TP_PLAN`: module name pattern -> style, and a table from each style to the layer that
does it (`STYLES`). Its weights are the reference's, sliced, each with its placement on
"tp" recorded (`Shard(dim)`, or whole: `Replicate()`, `Partial()`; `placement.py`). With
`overlap` (`--tp-overlap`, SP only) a second table (`OVERLAP_STYLES`) splits the same
weights but picks the layers of `collective_matmul` (section "Hiding TP communication"):
the all-gather into a block and the reduce-scatter out of it are each cut into t ring
steps that run behind the matmul they feed.
"""

import fnmatch

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm
from ..model import MoE, cross_entropy_sum
from . import regions
from .collective_matmul import (SEQ_DIM, CollectiveColumnParallelLinear,
                                CollectiveRowParallelLinear, enter_by_collective_matmul)
from ..placement import Partial, Replicate, Shard, local_index, place, placements


# ----------------------------------------------------------------- entering and leaving
def enter_tp(x, axis: comm.Axis, sp: bool):
    """Make the block's input whole on every rank: f (identity forward, all-reduce of the
    gradient backward), or under SP the all-gather of the sequence shards."""
    # SP: the gathered [b, s, h] arrives as a strided view (the ranks' pieces are stacked
    # along dim 0). Made contiguous once here, q, k and v share one copy, for compute and for
    # the tensors saved for backward; else each linear would copy (and save) its own.
    # Megatron keeps activations as [s, b, h] so that the sequence dim is the outer one.
    return (regions.gather_from_group(x, axis, SEQ_DIM).contiguous() if sp
            else regions.copy_to_group(x, axis))


def exit_tp(x, axis: comm.Axis, sp: bool):
    """Sum the ranks' partial outputs: g (all-reduce forward), or under SP a reduce-scatter
    that leaves each rank the sum for its own slice of the sequence."""
    return (regions.reduce_scatter_to_group(x, axis, SEQ_DIM) if sp
            else regions.reduce_from_group(x, axis))


def shard_param(full: torch.Tensor, axis: comm.Axis, dim: int) -> nn.Parameter:
    """This rank's 1/t of `full` along `dim`, as a parameter of its own, placed Shard(dim)
    on `axis`: the checkpoint and the Hugging Face reader cut a full tensor the same way."""
    how = Shard(dim)
    piece = full.detach()[local_index(full.shape, {axis.name: how}, {axis.name: axis})]
    return place(nn.Parameter(piece.clone(memory_format=torch.contiguous_format)), axis.name, how)


def replica_over_tp(p: nn.Parameter, axis: comm.Axis, sp: bool) -> nn.Parameter:
    """A weight every TP rank holds whole (a norm's, a row-parallel bias): Replicate(), so
    the gradient norm and the checkpoint count it once (`ProcessGrid.counts`). Under SP it
    meets only this rank's tokens and its gradient is a partial sum: Partial(), and
    `sum_partial_grads` adds the other ranks' parts once per step."""
    return place(p, axis.name, Partial() if sp else Replicate())


def sum_partial_grads(grads, axis: comm.Axis) -> None:
    """Complete, in place, the gradients placed Partial() on `axis` (`replica_over_tp`),
    given as (gradient this rank holds, parameter) pairs: one all-reduce of all of them,
    once per step.

    Called after the last micro-batch's backward and the data-parallel reduction: sums
    commute, so (sum over micro-batches and dp x cp of the TP-partial gradients) summed
    over TP is the full gradient, and it is one collective per step, not one per norm per
    micro-batch. Under ZeRO a rank holds a piece of each gradient: the piece is summed."""
    partial = [g for g, p in grads if placements(p).get(axis.name) == Partial()]
    if partial:
        flat = comm.all_reduce(torch.cat([g.reshape(-1) for g in partial]), axis)
        for g, total in zip(partial, flat.split([g.numel() for g in partial])):
            g.copy_(total.view_as(g))


# ------------------------------------------------------------------------ the layers
class ColumnParallelLinear(nn.Module):
    """y_r = x A_r^T (+ b_r): this rank's slice of the output features, from the whole x.

    x is already in the TP region: the plan entered it (f, or the SP all-gather) once for
    every layer that reads it (q, k, v; gate, up), not once per matrix (`entered`)."""

    def __init__(self, linear: nn.Linear, axis: comm.Axis, dim: int = 0):
        super().__init__()
        self.weight = shard_param(linear.weight, axis, dim=dim)
        self.bias = shard_param(linear.bias, axis, dim=0) if linear.bias is not None else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = g(x_r A_r^T) + b: this rank's slice of the input features in, the sum out
    (under SP the reduce-scatter: this rank's slice of the sequence of the sum).

    The bias is added after the reduction: added before, it would be counted t times.
    """

    def __init__(self, linear: nn.Linear, axis: comm.Axis, sp: bool = False):
        super().__init__()
        self.axis, self.sp = axis, sp
        self.weight = shard_param(linear.weight, axis, dim=1)
        # the bias is replicated: the same on every rank, added after the sum
        self.bias = (None if linear.bias is None
                     else replica_over_tp(nn.Parameter(linear.bias.detach().clone()), axis, sp))

    def forward(self, x):
        y = exit_tp(F.linear(x, self.weight), self.axis, self.sp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r V/t, (r+1) V/t) of the table. Each rank looks up the tokens that
    fall in its rows, writes zeros for the others, and the ranks' results are summed (g; a
    reduce-scatter along the sequence under SP). The gradient of each row is local."""

    def __init__(self, embedding: nn.Embedding, axis: comm.Axis, sp: bool = False):
        super().__init__()
        self.axis, self.sp = axis, sp
        self.weight = shard_param(embedding.weight, axis, dim=0)

    def forward(self, tokens):
        rows = self.weight.shape[0]           # this rank's: [rank * rows, (rank + 1) * rows)
        local = tokens - self.axis.rank * rows
        outside = (local < 0) | (local >= rows)
        h = F.embedding(local.masked_fill(outside, 0), self.weight)
        h = h.masked_fill(outside.unsqueeze(-1), 0.0)
        return exit_tp(h, self.axis, self.sp)


# ------------------------------------------------------------------------ the loss
class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Sum over tokens of  log sum_v exp(z_v) - z_target,  where each rank holds 1/t of the
    vocabulary's logits z. Three all-reduces of one number per token: the max (for a stable
    exp), the sum of exponentials, and the target's logit (it lives on one rank only). The
    gradient, softmax(z) - onehot(target), is local to each rank's slice: no backward traffic."""

    @staticmethod
    def forward(ctx, logits, targets, axis):
        z = logits.float()
        n_local = z.shape[-1]
        z = z - comm.all_reduce(z.max(dim=-1, keepdim=True).values, axis, op="max")
        local = targets.unsqueeze(-1) - axis.rank * n_local
        mine = (local >= 0) & (local < n_local)
        local = local.clamp(0, n_local - 1)
        exp = z.exp()
        sum_exp = comm.all_reduce(exp.sum(dim=-1, keepdim=True), axis)
        target_logit = comm.all_reduce(z.gather(-1, local) * mine, axis)
        ctx.save_for_backward(exp.div_(sum_exp), local, mine)
        ctx.dtype = logits.dtype
        return (sum_exp.log() - target_logit).sum()

    @staticmethod
    def backward(ctx, g):
        softmax, local, mine = ctx.saved_tensors
        grad = softmax.scatter_add(-1, local, -mine.to(softmax.dtype))
        return (grad * g).to(ctx.dtype), None, None


def vocab_parallel_cross_entropy_sum(logits_local, targets, tp_axis: comm.Axis):
    """Sum of token losses from this rank's vocabulary slice of the logits [..., V/t];
    the same value on every TP rank. Never gathers the [..., V] logits."""
    return (cross_entropy_sum(logits_local, targets) if tp_axis.size == 1
            else _VocabParallelCrossEntropy.apply(logits_local, targets, tp_axis))


# ------------------------------------------------------------------------ the plan
# Module name (fnmatch pattern, `*` = any layer index) -> how it is split.
#   vocab_embedding  rows of the table split over the vocabulary, output summed (g / RS)
#   replicated       the same weight on every rank (norms); under SP its input is sharded
#   enter            the block's input enters the TP region once: f, or the SP all-gather
#                    (under --tp-overlap: one collective matmul of its q, k, v or gate, up)
#   colwise          column-parallel, its input entered by its block
#   rowwise          row-parallel, output summed (g) or reduce-scattered (SP)
#   head             column-parallel over the vocabulary, entering by itself; its logits
#                    stay split for the vocab-parallel loss
TP_PLAN: tuple[tuple[str, str], ...] = (
    ("embed_tokens",                      "vocab_embedding"),
    ("layers.*.input_layernorm",          "replicated"),
    ("layers.*.self_attn",                "enter"),
    ("layers.*.self_attn.q_proj",         "colwise"),
    ("layers.*.self_attn.k_proj",         "colwise"),
    ("layers.*.self_attn.v_proj",         "colwise"),
    ("layers.*.self_attn.o_proj",         "rowwise"),
    ("layers.*.post_attention_layernorm", "replicated"),
    ("layers.*.mlp",                      "enter"),
    ("layers.*.mlp.gate_proj",            "colwise"),
    ("layers.*.mlp.up_proj",              "colwise"),
    ("layers.*.mlp.down_proj",            "rowwise"),
    # a mixture of experts: every expert split like the MLP, the shared ones too, each
    # output a partial sum that the block sums once on leaving (`entered`)
    ("layers.*.mlp.gate",                 "router"),
    ("layers.*.mlp.experts",              "experts"),
    ("layers.*.mlp.shared_experts.gate_proj", "colwise"),
    ("layers.*.mlp.shared_experts.up_proj",   "colwise"),
    ("layers.*.mlp.shared_experts.down_proj", "row_partial"),
    ("norm",                              "replicated"),
    ("lm_head",                           "head"),
)


def style_of(name: str, plan=TP_PLAN) -> str | None:
    return next((style for pattern, style in plan if fnmatch.fnmatchcase(name, pattern)), None)


def replicated(module: nn.Module, axis: comm.Axis, sp: bool) -> nn.Module:
    """Its weights stay whole on every rank (`replica_over_tp`)."""
    for p in module.parameters(recurse=False):
        replica_over_tp(p, axis, sp)
    return module


def entered(module: nn.Module, axis: comm.Axis, sp: bool) -> nn.Module:
    """`module`'s input enters the TP region before its forward runs, once for all the
    column-parallel layers inside that read it. A MoE block leaves it too: its experts'
    partial outputs, routed and shared, added up first, are summed over TP once."""
    module.register_forward_pre_hook(lambda mod, args: (enter_tp(args[0], axis, sp), *args[1:]))
    if isinstance(module, MoE):
        module.register_forward_hook(lambda mod, args, out: exit_tp(out, axis, sp))
    return module


def experts(module: nn.Module, axis: comm.Axis, sp: bool) -> nn.Module:
    """Each expert split like the MLP: gate and up by output rows, down by input columns."""
    for name, dim in (("gate_proj", 1), ("up_proj", 1), ("down_proj", 2)):
        setattr(module, name, shard_param(getattr(module, name), axis, dim))
    return module


# style -> the layer that does it: (reference module, TP axis, sp) -> its replacement
STYLES = {
    "vocab_embedding": VocabParallelEmbedding,
    "replicated": replicated,
    "enter": entered,
    "colwise": lambda m, axis, sp: ColumnParallelLinear(m, axis),
    "rowwise": RowParallelLinear,
    "head": lambda m, axis, sp: entered(ColumnParallelLinear(m, axis), axis, sp),
    # the router is whole on every rank, which routes alike; its gradient comes through the
    # experts' partial outputs, so it is a partial sum: Partial(), as a norm's under SP
    "router": lambda m, axis, sp: replicated(m, axis, sp=True),
    "experts": experts,
    # row-parallel without its own sum: the MoE block sums once (`entered`)
    "row_partial": lambda m, axis, sp: ColumnParallelLinear(m, axis, dim=1),
}
# --tp-overlap: the same split, the collective matmul's layers (`collective_matmul`)
OVERLAP_STYLES = STYLES | {
    "enter": enter_by_collective_matmul,
    "rowwise": lambda m, axis, sp: CollectiveRowParallelLinear(RowParallelLinear(m, axis, sp)),
    "head": lambda m, axis, sp: CollectiveColumnParallelLinear(ColumnParallelLinear(m, axis), axis),
}


def apply_tensor_parallel(model: nn.Module, tp_axis: comm.Axis, sp: bool = False, plan=TP_PLAN,
                          overlap: bool = False):
    """Split `model` (the reference Transformer, or a pipeline stage of it) over `tp_axis`,
    in place, by `plan`; return it. Modules the plan does not name are left alone.
    `overlap` (needs `sp`): the collective matmul's layers (`OVERLAP_STYLES`)."""
    styles = OVERLAP_STYLES if overlap else STYLES
    head, embedding = model.lm_head, model.embed_tokens
    tied = head is not None and embedding is not None and head.weight is embedding.weight
    # children before their block: a block's collective matmul computes with their shards
    for name, module in reversed(list(model.named_modules())):
        if (style := style_of(name, plan)) is not None:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, styles[style](module, tp_axis, sp))
    if tied:      # embedding and head split the same way (rows = vocabulary): one shard
        model.lm_head.weight = model.embed_tokens.weight
    return model
