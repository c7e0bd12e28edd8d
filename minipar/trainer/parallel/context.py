"""Context parallelism (CP): split each sequence over cp ranks, keep attention exact.

Chapter "Context parallelism".

Everything in a Transformer layer but attention works token by token, so cutting the
sequence into pieces costs nothing there: each rank keeps 1/cp of the tokens and 1/cp of
their activations. Attention alone needs every earlier token. Three ways to give it them:

  ring       (Liu et al. 2023) K/V blocks travel round the CP group by point-to-point
             sends; each rank folds them into its result one at a time with the
             log-sum-exp trick (online softmax), and no rank ever holds the whole K/V.
  allgather  (Llama 3) all-gather K and V once, then attend with the local queries.
             Under grouped-query attention K and V are small, and any mask is easy.
  ulysses    (DeepSpeed-Ulysses, Jacobs et al. 2023) an all-to-all trades the sequence
             shards of q, k, v for head shards: each rank then holds the whole sequence
             for 1/cp of the heads, attends as on one device, and a second all-to-all
             trades back. Needs heads divisible by cp.

The causal mask makes a naive split unfair: the rank holding the end of the sequence
attends to everything, the one holding the start to almost nothing. The load-balanced
("zigzag") layout cuts the sequence into 2*cp chunks and gives rank i the chunks i and
2*cp-1-i, one early and one late, so every rank does the same work.

`apply_context_parallel` swaps each layer's `self_attn.core` for one of these functions;
`shard_for_context_parallel` gives a rank its tokens and their positions (RoPE uses them).
Gradients are then summed over dp x cp like data-parallel ones (`grid.dp_cp`).
"""

import functools
import math

import torch

from .. import comm
from ..model import causal_attention
from . import regions


# ============================================================ the load-balanced layout
def zigzag_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (of 2*cp) that rank holds: one from the start, one from the end."""
    return rank, 2 * cp - 1 - rank


def local_positions(seq_len: int, rank: int, cp: int, layout=zigzag_chunks) -> torch.Tensor:
    """Positions of the tokens a rank holds, in the order it holds them. The sequence divides
    into 2*cp chunks: `ParallelConfig` refuses a `--seq-len` that does not (`--cp` "chunks")."""
    c = seq_len // (2 * cp)
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in layout(rank, cp)])


def shard_for_context_parallel(x: torch.Tensor, y: torch.Tensor, cp_axis: comm.Axis):
    """This CP rank's tokens x, targets y ([b, s] -> [b, s/cp]) and their positions.

    A pure function of (x, y, rank, size): every pipeline stage can recompute it. Targets
    stay with their inputs, so the loss, a sum over tokens, just adds up across ranks.
    """
    pos = local_positions(x.shape[1], cp_axis.rank, cp_axis.size)
    return x[:, pos], y[:, pos], pos


def shard_sequence(x: torch.Tensor, y: torch.Tensor, cp_axis: comm.Axis):
    """Inputs, targets and positions of the tokens this rank computes: under CP its
    (load-balanced) chunks; otherwise the whole sequence at positions 0..s-1."""
    if cp_axis.size > 1:
        return shard_for_context_parallel(x, y, cp_axis)
    return x, y, torch.arange(x.shape[1], device=x.device)


# ============================================================ which blocks are computed
def ring_steps(rank: int, cp: int, layout=zigzag_chunks):
    """What `rank` computes at each step of the ring, as data.

    At step t it holds the K/V block of rank (rank - t) mod cp. Its two query chunks (slots
    0, 1) meet that block's two key chunks: a key chunk after the query chunk is masked
    out entirely (skipped), the same chunk is the causal diagonal, an earlier one is full.
    Returns [(source_rank, [(q_slot, k_slot, diagonal), ...]) for t in range(cp)].
    """
    mine = layout(rank, cp)
    return [(src, [(a, b, qc == kc) for a, qc in enumerate(mine)
                   for b, kc in enumerate(layout(src, cp)) if kc <= qc])
            for src in [(rank - t) % cp for t in range(cp)]]


# ============================================================ one block of attention
# Grouped layout: q as [b, s, n_kv, group, d], so each K/V head serves its group of query
# heads without being repeated (GQA: K and V are never expanded, in memory or on the wire).
def _grouped(x: torch.Tensor, n_kv: int) -> torch.Tensor:
    b, s, h, d = x.shape
    return x.reshape(b, s, n_kv, h // n_kv, d)


def _ungrouped(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.reshape(like.shape).to(like.dtype)


def _scores(q, k, diagonal: bool, scale: float):
    s = torch.einsum("bqhgd,bkhd->bqhgk", q, k) * scale
    if diagonal:    # the same chunk of positions on both sides: mask the future
        future = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future[:, None, None, :], float("-inf"))
    return s


def block_forward(q, k, v, diagonal: bool, scale: float):
    """Attention of query rows q [b, sq, hkv, g, d] against one key block k, v [b, sk, hkv, d]:
    the block's softmax-normalised output and its log-sum-exp per query row [b, sq, hkv, g]."""
    s = _scores(q, k, diagonal, scale)
    lse = s.logsumexp(-1)
    return torch.einsum("bqhgk,bkhd->bqhgd", torch.exp(s - lse[..., None]), v), lse


def merge(out, lse, block_out, block_lse):
    """Fold one block's result into the running one (online softmax).

    Each is softmax-weighted over its own keys; reweighting by exp(lse_part - lse_total)
    gives the softmax over the union. Exact, in any order of blocks.
    """
    new_lse = torch.logaddexp(lse, block_lse)
    return (out * torch.exp(lse - new_lse)[..., None]
            + block_out * torch.exp(block_lse - new_lse)[..., None]), new_lse


def block_backward(q, k, v, dout, lse, delta, diagonal: bool, scale: float):
    """Gradients of one block from the *final* log-sum-exp (FlashAttention's backward):
    P = exp(S - lse) is this block's share of the full softmax, and
    dS = P * (dP - delta) with delta = rowsum(dout * out)."""
    p = torch.exp(_scores(q, k, diagonal, scale) - lse[..., None])
    dv = torch.einsum("bqhgk,bqhgd->bkhd", p, dout)
    dp = torch.einsum("bqhgd,bkhd->bqhgk", dout, v)
    ds = p * (dp - delta[..., None])
    dq = torch.einsum("bqhgk,bkhd->bqhgd", ds, k) * scale
    dk = torch.einsum("bqhgk,bqhgd->bkhd", ds, q) * scale
    return dq, dk, dv


def _rows(slot: int, c: int) -> slice:
    return slice(slot * c, (slot + 1) * c)


class OnlineSoftmax:
    """This rank's queries and the attention they have accumulated so far (the online
    softmax: an output and a log-sum-exp per query row). Both CP attentions keep one while
    K/V blocks come by, one block at a time, in any order."""

    def __init__(self, q, n_kv: int, out=None, lse=None, dout=None):
        """Forward: the queries alone, nothing attended yet. Backward: with the forward's
        out and lse, and dout, the output's gradient, to backpropagate block by block."""
        self.q = _grouped(q.float(), n_kv)
        self.c = q.shape[1] // 2                  # the two chunks this rank holds
        self.scale = 1.0 / math.sqrt(q.shape[-1])
        self.out = torch.zeros_like(self.q) if out is None else out
        self.lse = torch.full(self.q.shape[:-1], -math.inf, device=q.device) if lse is None else lse
        if dout is not None:        # the backward: dq accumulates; delta = rowsum(dout * out)
            self.dout = _grouped(dout.float(), n_kv)
            self.delta = (self.dout * self.out).sum(-1)
            self.dq = torch.zeros_like(self.q)

    def attend(self, k, v, pairs):
        """Fold one rank's K/V block into the output, for the chunk pairs the mask keeps."""
        for a, b, diagonal in pairs:
            rows, cols = _rows(a, self.c), _rows(b, self.c)
            o, l = block_forward(self.q[:, rows], k[:, cols].float(), v[:, cols].float(),
                                 diagonal, self.scale)
            self.out[:, rows], self.lse[:, rows] = merge(self.out[:, rows], self.lse[:, rows], o, l)

    def backprop(self, k, v, pairs, dk, dv):
        """Add this block's share to dq, and to the block's dk, dv (in place)."""
        for a, b, diagonal in pairs:
            rows, cols = _rows(a, self.c), _rows(b, self.c)
            dq_, dk_, dv_ = block_backward(self.q[:, rows], k[:, cols].float(), v[:, cols].float(),
                                           self.dout[:, rows], self.lse[:, rows],
                                           self.delta[:, rows], diagonal, self.scale)
            self.dq[:, rows] += dq_
            dk[:, cols] += dk_.to(dk.dtype)
            dv[:, cols] += dv_.to(dv.dtype)


# ============================================================ ring attention
class _RingAttention(torch.autograd.Function):
    """Exact causal attention of this rank's queries against the whole sequence's keys.

    Forward: cp steps; at each, attend to the K/V block in hand while the next one travels.
    Only q, k, v, the output and its log-sum-exp are kept: never a remote block.
    Backward: the K/V blocks go round again, now with dK/dV accumulators that every rank
    adds its share to; after the last step each accumulator takes one hop home. Overlapped
    like the forward: the next block is posted before this one is computed, and a block's
    accumulator, posted after, travels while the next block is computed.
    `steps`: this rank's `ring_steps`, the schedule both loops follow.
    """

    @staticmethod
    def forward(ctx, q, k, v, axis, steps):
        k, v = k.contiguous(), v.contiguous()
        queries = OnlineSoftmax(q, k.shape[2])
        k_cur, v_cur = k, v
        for t, (_, pairs) in enumerate(steps):
            # the next block travels while this one is used (none after the last step)
            in_flight = comm.ring_exchange(axis, k_cur, v_cur) if t < len(steps) - 1 else None
            queries.attend(k_cur, v_cur, pairs)
            if in_flight is not None:
                k_cur, v_cur = in_flight.wait()
        ctx.save_for_backward(q, k, v, queries.out, queries.lse)
        ctx.axis, ctx.steps = axis, steps
        return _ungrouped(queries.out, q)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        queries = OnlineSoftmax(q, k.shape[2], out, lse, dout)
        kv_in_flight = comm.ring_exchange(ctx.axis, k, v)   # step 1's block, already going
        # step 0, this rank's own block: its gradient stays here
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        queries.backprop(k, v, ctx.steps[0][1], dk, dv)
        # steps 1..cp-1: a block arrives; its dK/dV, summed by its previous holders, follows
        # (nothing yet at step 1: the accumulator starts there, so it need not travel)
        acc_in_flight = None
        for t, (_, pairs) in enumerate(ctx.steps[1:], start=1):
            k_cur, v_cur = kv_in_flight.wait()
            if t < len(ctx.steps) - 1:   # the next block travels while this one is used
                kv_in_flight = comm.ring_exchange(ctx.axis, k_cur, v_cur)
            dk_new, dv_new = torch.zeros_like(k), torch.zeros_like(v)
            queries.backprop(k_cur, v_cur, pairs, dk_new, dv_new)
            if acc_in_flight is not None:   # what earlier holders added, arrived meanwhile
                dk_prev, dv_prev = acc_in_flight.wait()
                dk_new, dv_new = dk_new + dk_prev, dv_new + dv_prev
            # this block's sum so far travels on while the next block is computed
            acc_in_flight = comm.ring_exchange(ctx.axis, dk_new, dv_new)
        # the last accumulators sent hold the next rank's block, complete: one hop home;
        # the one that arrived is mine
        dk_home, dv_home = acc_in_flight.wait()
        return _ungrouped(queries.dq, q), dk + dk_home, dv + dv_home, None, None


def ring_attention(q, k, v, axis: comm.Axis, layout=zigzag_chunks):
    """Causal attention for this rank's queries q [b, s_local, hq, d] against the whole
    sequence, whose K/V [b, s_local, hkv, d] blocks are spread over the ranks of `axis`."""
    if axis.size == 1:
        return causal_attention(q, k, v)
    return _RingAttention.apply(q, k, v, axis, ring_steps(axis.rank, axis.size, layout))


# ============================================================ all-gather K/V (Llama 3)
class _GatheredAttention(torch.autograd.Function):
    """The ring's arithmetic with every block already here: k, v [b, cp*s_local, hkv, d]
    hold the blocks of ranks 0..cp-1 in rank order (not position order). The blocks the
    causal mask hides are skipped; their dK, dV are zero. `steps`: this rank's `ring_steps`."""

    @staticmethod
    def forward(ctx, q, k, v, steps):
        queries, n = OnlineSoftmax(q, k.shape[2]), q.shape[1]
        for src, pairs in steps:
            queries.attend(k[:, src * n:(src + 1) * n], v[:, src * n:(src + 1) * n], pairs)
        ctx.save_for_backward(q, k, v, queries.out, queries.lse)
        ctx.steps = steps
        return _ungrouped(queries.out, q)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        queries, n = OnlineSoftmax(q, k.shape[2], out, lse, dout), q.shape[1]
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for src, pairs in ctx.steps:
            blk = slice(src * n, (src + 1) * n)
            queries.backprop(k[:, blk], v[:, blk], pairs, dk[:, blk], dv[:, blk])
        return _ungrouped(queries.dq, q), dk, dv, None


def allgather_attention(q, k, v, axis: comm.Axis, layout=zigzag_chunks):
    """Llama 3's context parallelism: all-gather K and V over the CP group, then attend.

    The gather's backward is a reduce-scatter: every rank's dK/dV for a block are summed on
    the rank that owns it (`regions.gather_from_group`). K and V travel in one tensor. The
    gathered K/V are kept for the backward: the whole sequence's, but GQA makes them small.
    """
    kv = regions.gather_from_group(torch.stack([k, v]), axis, dim=2)
    return _GatheredAttention.apply(q, kv[0], kv[1], ring_steps(axis.rank, axis.size, layout))


# ============================================================ Ulysses (all-to-all over heads)
def ulysses_attention(q, k, v, axis: comm.Axis, layout=zigzag_chunks):
    """DeepSpeed-Ulysses: q [b, s/cp, hq, d], k, v [b, s/cp, hkv, d] (this rank's tokens,
    every head) become [b, s, h/cp, d] (every token, this rank's heads) by one all-to-all,
    attention runs as on one device, and the output goes back the same way.

    The tokens arrive in rank order, each rank's zigzag chunks: they are put in position
    order for the causal mask, and back before the return trip. Fewer KV heads than ranks
    (GQA): each KV head is replicated to the cp/hkv ranks whose query heads read it.
    """
    cp = axis.size
    if k.shape[2] % cp:
        k, v = (t.repeat_interleave(cp // k.shape[2], dim=2) for t in (k, v))
    held = torch.cat([local_positions(q.shape[1] * cp, j, cp, layout) for j in range(cp)])
    held = held.to(q.device)            # the position of each token after the exchange
    in_order = held.argsort()
    q_heads = regions.all_to_all(q, axis, split_dim=2, concat_dim=1)[:, in_order]
    kv = regions.all_to_all(torch.stack([k, v]), axis, split_dim=3, concat_dim=2)[:, :, in_order]
    out = causal_attention(q_heads, kv[0], kv[1])
    return regions.all_to_all(out[:, held], axis, split_dim=1, concat_dim=2)


CORES = {"ring": ring_attention, "allgather": allgather_attention, "ulysses": ulysses_attention}


def apply_context_parallel(model, cp_axis: comm.Axis, impl: str = "ring"):
    """Make every attention layer of `model` context-parallel over `cp_axis` (`impl` one of
    `CORES`, as `ParallelConfig` checks `--cp-impl`)."""
    for layer in model.layers.values():
        layer.self_attn.core = functools.partial(CORES[impl], axis=cp_axis)
    return model
