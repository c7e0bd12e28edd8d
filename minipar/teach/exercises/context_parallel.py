"""The exercises of the context parallelism chapter, checked (see core.py for how).

The code exercises run on real gloo ranks against one device's attention, at every step of
a short sequence of inputs, and report step, rank, tensor, first wrong element and largest
difference. The fixtures are chosen to catch the usual bugs: the LSE merge sees scores
large enough that a naive exp(lse) overflows float32, and grouped-query heads; the zigzag
layout is checked for coverage and balance before it runs, because a wrong zigzag can
still give exact attention (the ring computes whatever pairs the mask keeps) while one
rank does most of the work.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from ...plan.config import ModelConfig, ParallelConfig
from ...plan.config import TrainConfig
from ...plan.formulas.context_parallel import cp_wire_bytes_per_step
from ...trainer.comm import Axis
from ...trainer.grid import ProcessGrid
from ...trainer.model import causal_attention
from ...trainer.parallel import context
from ...trainer.parallel.context import (block_forward, local_positions, ring_attention,
                                         shard_for_context_parallel)
from ...trainer.parallel.context_analysis import attention_work, contiguous_chunks
from ...trainer.parallel.regions import gather_from_group
from ...trainer.step import Trainer
from ...runtime.launch import run_local
from ...runtime.run import train
from ...runtime.wire_meter import steps_by_axis
from .. import replays
from .collectives import HEADERS_WHY, RING_NOT_GLOO
from .core import (FLOAT32, Tolerance, Verdict, at, exercise, first_difference, function_given,
                   on_ranks, predicted, replayed_exposure, right, wrong, yours)

STEPS = 2              # step 1 scales the queries so that a naive exp(lse) overflows float32
CP = 2                 # gloo ranks of the code checks
PREDICT_RUN = dict(cp=2, cp_impl="allgather", seq_len=32, global_batch=8)   # the predict exercise


# ----------------------------------------------------------------- predict, then run: the naive split
def _counted_scores_worker(layout, seq_len: int):
    """On each rank: ring attention over the sequence laid out by `layout`, forward only,
    with every block's scores counted where the mask keeps them (finite), as they are
    computed. Returns this rank's count, per query head and sequence."""
    grid = ProcessGrid(cp=dist.get_world_size(), rank=dist.get_rank()).init_groups()
    kept, block = [0], context.block_forward

    def counting(q, k, v, diagonal, scale):
        scores = context._scores(q[:1, :, :1, :1], k[:1, :, :1], diagonal, scale)
        kept[0] += int(torch.isfinite(scores).sum())
        return block(q, k, v, diagonal, scale)
    context.block_forward = counting
    try:
        q, k, v, _ = _attention_fixture(0, s=seq_len, big=1.0)
        pos = local_positions(seq_len, grid.cp.rank, grid.cp.size, layout)
        with torch.no_grad():
            ring_attention(q[:, pos], k[:, pos], v[:, pos], grid.cp, layout=layout)
    finally:
        context.block_forward = block
    return kept[0]


@functools.cache
def counted_scores(seq_len: int, cp: int, layout=contiguous_chunks) -> tuple[int, ...]:
    """The query-key scores each of `cp` gloo ranks computes in ring attention under
    `layout`, counted from the scores themselves as the ring computes them."""
    return tuple(run_local(_counted_scores_worker, cp, layout, seq_len, backend="gloo"))


@exercise("context_parallel", "predict")
def check_contiguous_imbalance(prediction, seq_len: int = 1024, cp: int = 4,
                               measured: float | None = None, reveal: bool = False) -> Verdict:
    """Predict the busiest over the least busy rank's attention work when the sequence is
    split contiguously (rank i holds chunks 2i and 2i+1 of 2 cp); the check runs ring
    attention with that layout on `cp` gloo ranks, counts the scores each rank computes
    where the causal mask keeps them, and compares (or takes `measured`, the ratio)."""
    def run():
        work = counted_scores(seq_len, cp)
        return max(work) / min(work)
    return predicted(prediction, run if measured is None else measured, "the imbalance", 1e-6,
                     "every score the ring computes is counted", reveal=reveal, hints=[
        (float(cp), "that counts blocks, a diagonal block as a full one: under the mask a "
                    "diagonal block keeps c(c+1)/2 scores, not c²."),
        (2 * cp - 1.0, "count every block the busiest rank meets: its chunks' diagonal "
                       "blocks are triangles of c(c+1)/2 scores."),
    ])


@exercise("context_parallel", "implement")
def check_zigzag(fn) -> Verdict:
    """fn(seq_len, rank, cp) -> the positions this CP rank holds, in the order it holds them."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for seq_len, cp in [(8, 2), (16, 4), (24, 3)]:
        tokens = torch.arange(seq_len).unsqueeze(0)
        for rank in range(cp):
            axis = Axis("cp", tuple(range(cp)), rank)
            want = shard_for_context_parallel(tokens, tokens, axis)[2].tolist()
            try:
                got = [int(i) for i in fn(seq_len, rank, cp)]
            except Exception as e:   # noqa: BLE001
                return wrong(f"{yours(fn)}({seq_len}, {rank}, {cp}) raised {type(e).__name__}: {e}")
            if got != want:
                if sorted(got) == sorted(want):
                    return wrong(f"{yours(fn)}({seq_len}, {rank}, {cp}) has the right positions in the "
                                  f"wrong order: the early chunk comes first.")
                return wrong(f"{yours(fn)}({seq_len}, {rank}, {cp}) returned {got}: not the two chunks of "
                              f"seq_len/(2 cp) tokens this rank should hold.")
    return right("your layout matches shard_for_context_parallel for every rank.")


# ----------------------------------------------------------------- the LSE merge, on ranks
def _attention_fixture(step: int, hq: int = 4, hkv: int = 2, s: int = 16, d: int = 8,
                       big: float = 60.0):
    """The same q [1, s, hq, d], k, v [1, s, hkv, d] and upstream gradient on every rank; at
    step 1 the queries are scaled by `big`, so that the scores reach the hundreds."""
    gen = torch.Generator().manual_seed(7 + step)
    q, k, v = (torch.randn(1, s, h, d, generator=gen) for h in (hq, hkv, hkv))
    dout = torch.randn(1, s, hq, d, generator=gen)
    return q * (1.0 if step == 0 else big), k, v, dout


def _full_attention(q, k, v, dout):
    """One device, no mask: softmax(q k^T / sqrt d) v with each K/V head serving its group."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, kk) / math.sqrt(q.shape[-1]), -1)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def _scaled(ref) -> Tolerance:
    """Float32, relative to the tensor's largest element: with scores in the hundreds the
    gradients are sums of large terms that cancel, and each term carries its own rounding."""
    return Tolerance(1e-4 * max(1.0, ref.abs().max().item()), 1e-4,
                     "float32, scores in the hundreds: 1e-4 of the tensor's largest element")


def _merged_attention(merge_fn, q, k, v, axis):
    """This rank's queries against every rank's K/V block (all-gathered, differentiable:
    its backward reduce-scatters dK, dV), the blocks folded together by `merge_fn`."""
    n_kv, d = k.shape[2], q.shape[-1]
    qg = q.reshape(*q.shape[:2], n_kv, -1, d)
    ks = gather_from_group(k.unsqueeze(0), axis, 0)
    vs = gather_from_group(v.unsqueeze(0), axis, 0)
    out, lse = block_forward(qg, ks[0], vs[0], diagonal=False, scale=d ** -0.5)
    for j in range(1, axis.size):
        o, l = block_forward(qg, ks[j], vs[j], diagonal=False, scale=d ** -0.5)
        out, lse = merge_fn(out, lse, o, l)
    return out.reshape(q.shape)


def _merge_worker(fn):
    grid = ProcessGrid(cp=dist.get_world_size(), rank=dist.get_rank()).init_groups()
    axis = grid.cp
    for step in range(STEPS):
        q, k, v, dout = _attention_fixture(step)
        want = _full_attention(q, k, v, dout)
        rows = q.shape[1] // axis.size
        mine = slice(axis.rank * rows, (axis.rank + 1) * rows)
        ql, kl, vl = (t[:, mine].clone().requires_grad_() for t in (q, k, v))
        out = _merged_attention(fn, ql, kl, vl, axis)
        out.backward(dout[:, mine])
        for name, got, ref in (("out", out, want[0]), ("dq", ql.grad, want[1]),
                               ("dk", kl.grad, want[2]), ("dv", vl.grad, want[3])):
            ref = ref[:, mine]
            problem = at(step, axis.rank, first_difference(got, ref, name, _scaled(ref)))
            if problem:
                return problem
    return None


@exercise("context_parallel", "implement")
def check_lse_merge(fn) -> Verdict:
    """fn(out1, lse1, out2, lse2) -> (out, lse): two blocks' attention results, each
    normalised over its own keys with its log-sum-exp, merged into the attention over both.
    Run on 2 gloo ranks (all-gather attention, GQA heads) with autograd through it."""
    return on_ranks(CP, _merge_worker, fn,
        "your merge gives one device's attention and its gradients (dq, dk, dv) at every "
        "step, including scores large enough to overflow a naive exp, on 2 gloo ranks.")


# ----------------------------------------------------------------- find the bug: the zigzag
def buggy_zigzag_chunks(rank: int, cp: int) -> tuple[int, int]:
    """A load-balanced layout with a bug (the exercise): the two chunks (of 2*cp) rank holds."""
    return rank, cp + rank


def _layout_problem(layout) -> str | None:
    """Coverage and balance, symbolically, before anything runs."""
    for cp in (2, 3, 4, 8):
        try:
            held = [tuple(layout(r, cp)) for r in range(cp)]
        except Exception as e:   # noqa: BLE001
            return f"layout(rank, {cp}) raised {type(e).__name__}: {e}"
        chunks = sorted(c for pair in held for c in pair)
        if chunks != list(range(2 * cp)):
            return f"at cp={cp} the ranks hold chunks {held}: not each of 0..{2 * cp - 1} once."
        if any(a > b for a, b in held):
            return f"at cp={cp} a rank holds {held}: list the early chunk first."
        work = attention_work(2 * cp * 8, cp, layout)
        if max(work) != min(work):
            return (f"attention stays exact (every pair is computed once), but at cp={cp} the "
                    f"work per rank is {work}: the busiest does {max(work) / min(work):.2f}x "
                    f"the least busy.")
    return None


def _ring_worker(layout):
    grid = ProcessGrid(cp=dist.get_world_size(), rank=dist.get_rank()).init_groups()
    axis = grid.cp
    for step in range(STEPS):
        q, k, v, dout = _attention_fixture(step, big=1.0)
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        want = causal_attention(*ref)
        want.backward(dout)
        pos = local_positions(q.shape[1], axis.rank, axis.size, layout)
        ql, kl, vl = (t[:, pos].clone().requires_grad_() for t in (q, k, v))
        out = ring_attention(ql, kl, vl, axis, layout=layout)
        out.backward(dout[:, pos])
        for name, got, r in (("out", out, want), ("dq", ql.grad, ref[0].grad),
                             ("dk", kl.grad, ref[1].grad), ("dv", vl.grad, ref[2].grad)):
            problem = at(step, axis.rank, first_difference(got, r.detach()[:, pos], name, FLOAT32))
            if problem:
                return problem
    return None


@exercise("context_parallel", "bug")
def check_zigzag_fix(layout) -> Verdict:
    """layout(rank, cp) -> (early chunk, late chunk): the fixed `buggy_zigzag_chunks`.
    Checked for coverage and balance at cp 2, 3, 4, 8, then run by ring attention on 2 gloo
    ranks against one device's causal attention."""
    problem = function_given(layout)
    if problem is not None:
        return problem
    problem = _layout_problem(layout)
    if problem:
        return wrong(problem)
    return on_ranks(CP, _ring_worker, layout,
        "every chunk once, equal work on every rank, and ring attention with your layout "
        "matches one device (output, dq, dk, dv) at every step on 2 gloo ranks.")


# ----------------------------------------------------------------- predict, then run


def measured_cp_bytes(**run) -> int:
    """The bytes rank 0 wrote to its sockets for the cp axis in one step of `tiny` on gloo
    (`wire.steps_by_axis`: each collective measured on its own, filed under its axis)."""
    kw = {**PREDICT_RUN, **run}
    pc = ParallelConfig(cp=kw["cp"], cp_impl=kw["cp_impl"])
    with steps_by_axis(Trainer):
        out = train(TrainConfig(parallel=pc, steps=1, seq_len=kw["seq_len"],
                                global_batch=kw["global_batch"], progress=False))
    return out["records"][-1]["wire"]["cp"]


@exercise("context_parallel", "predict")
def check_predict_cp_bytes(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes one rank sends on the cp axis in one training step of `tiny`
    (cp=2, all-gather attention, 8 sequences of 32 tokens, float32) on gloo; the check runs
    it and compares with what rank 0 wrote to its sockets for the cp axis (`wire`)."""
    tiny = ModelConfig.preset("tiny")
    ring = cp_wire_bytes_per_step(tiny, PREDICT_RUN["global_batch"], PREDICT_RUN["seq_len"],
                                  PREDICT_RUN["cp"], PREDICT_RUN["cp_impl"])
    return predicted(prediction, measured_cp_bytes if measured is None else measured,
                     "the bytes on the cp axis", rel=0.02, why=HEADERS_WHY, unit="B", reveal=reveal,
                     hints=[(ring / 2, "that is the forward's all-gather alone: its backward, a "
                                       "reduce-scatter of dK and dV, sends too."),
                            (ring, RING_NOT_GLOO)])


# ---------------------------------------------------------------- predict, then replay
@exercise("context_parallel", "predict")
def check_replayed_cp_exposure(predicted_ms, reveal: bool = False) -> Verdict:
    """Predict how long rank 0 waits for CP per step (exposed time, ms) with all-gather
    attention (`--cp 2 --cp-impl allgather`) replayed at Llama 3 8B's shapes and 32K tokens
    on H100s; the check replays it (`teach.replays`, the chapter's figure)."""
    def clues(truth):
        ring = replays.replayed("context_parallel")
        hints = [(0.0, "that is the ring's: its next K/V block travels while the current one's "
                       "attention runs. The all-gather's attention needs every block first."),
                 (truth / 2, "that is the forward's all-gathers alone: their backward, a "
                             "reduce-scatter of dK and dV, sends as many bytes back.")]
        return hints, (f" The ring moves {ring.hidden_s['cp'] * 1e3:.3g} ms of K/V per step and "
                       f"exposes {ring.exposed_s['cp'] * 1e3:.2g} ms: each block hides behind the "
                       "attention of the one before, which at this length takes far longer.")
    return replayed_exposure(predicted_ms, reveal, "the all-gather's exposed CP time per step",
                             "context_parallel_allgather", "cp", clues)


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_zigzag_chunks"]
