"""The exercises of the tensor parallelism chapter, checked (see core.py for how).

Code runs on real gloo ranks against the single-device computation, at every step of a
short SGD run, and a wrong tensor is reported by step, rank, name, first wrong element and
largest difference. The fixtures are chosen to catch the usual bugs: a missing f leaves the
input gradient a partial sum, a g that all-reduces its backward multiplies the weight
gradients by t, a bias added before the all-reduce is counted t times.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ...plan.config import ParallelConfig
from ...plan.config import ModelConfig, TrainConfig
from ...plan.formulas.tensor_parallel import (tp_layer_bytes, tp_wire_bytes_breakdown,
                                              tp_wire_bytes_per_step)
from ...trainer.grid import ProcessGrid
from ...trainer.parallel.regions import reduce_from_group
from ...trainer.step import Trainer
from ...runtime import launch
from ...runtime.run import train
from ...runtime.wire_meter import steps_by_axis
from .. import replays
from .collectives import HEADERS_WHY, RING_NOT_GLOO, diagnosed
from .core import (FLOAT32, Verdict, at, compare_calls, exercise, first_difference, function_given,
                   on_ranks, predicted, replayed_exposure, yours)

STEPS, LR = 2, 0.1       # two SGD steps: the second starts from the first's update


def _tp_block_mistakes(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool):
    want = tp_layer_bytes(tokens, dim, tp, act_bytes, sp=sp)
    if tp == 1:
        return [(None, "with t = 1 there are no partial sums to add: nothing is sent.")]
    return [
        (want / 2, "half the count. Under sequence parallelism each sum is a reduce-scatter "
                   "and an all-gather of the same tensor, and both travel; and the backward "
                   "pass has collectives of its own (f's), as many as the forward's (g's)."
                   if sp else "half the count: the backward pass has all-reduces of its own "
                   "(f's), as many as the forward's (g's); and an all-reduce is two phases."),
        (want / 4, "one sum per block: attention and the MLP each end in one, and the "
                   "backward pass has its own."),
        (want / tp, "the partial sums are full-size [tokens, dim] on every rank, not 1/t of it."),
        (want * tp / (tp - 1), "a ring phase takes t-1 steps, not t: the chunk a rank keeps "
                               "never leaves it."),
        (want / act_bytes, "that counts elements; each is act_bytes bytes."),
        (want * 3 / 2, "six sums: that is with full recomputation, which runs the forward "
                       "again; count one forward and one backward."),
    ]


# ----------------------------------------------------------------- find the bug: a block's bytes
def buggy_tp_block_bytes(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool) -> float:
    """The bytes one TP rank sends for one transformer block (attention + MLP, Megatron's
    layout), one micro-batch, forward and backward, ring collectives, with two bugs (the
    exercise)."""
    size = tokens * dim * act_bytes                 # one [tokens, dim] activation
    one_sum = (tp - 1) / tp * size                  # reduce-scatter, or all-gather: one ring pass
    sums = 2                                        # g after attention and after the MLP
    return sums * one_sum


TP_RUN = dict(global_batch=8, seq_len=32)        # tiny, float32, one micro-batch
TP_VARIANTS = [dict(sp=False), dict(sp=True)]


def _tp_steps(variants):
    """On each rank: one step of `tiny` per variant; the bytes its collectives sent on the
    tp axis, as CommLog counts them."""
    out = []
    for kw in variants:
        cfg = TrainConfig(parallel=ParallelConfig(tp=dist.get_world_size(), **kw), steps=1,
                          progress=False, **TP_RUN)
        cfg.validate()
        comm = Trainer(cfg).step(0)["comm"].get("tp", {})
        out.append(sum(op["wire_bytes"] for op in comm.values()))
    return out


@functools.cache
def tp_run_bytes(tp: int) -> dict:
    """{sp: tp bytes rank 0 sent in one step of tiny} from one world of `tp` gloo ranks."""
    sent = launch.run(_tp_steps, tp, TP_VARIANTS, timeout_s=300)[0]
    return {kw["sp"]: b for kw, b in zip(TP_VARIANTS, sent)}


def outside_blocks(tp: int, sp: bool) -> int:
    """What the step sends besides its blocks: the vocab-parallel embedding, head and loss,
    and under SP the norms' partial gradients (`tp_wire_bytes_breakdown`)."""
    parts = tp_wire_bytes_breakdown(ModelConfig.preset("tiny"), TP_RUN["global_batch"],
                                    TP_RUN["seq_len"], tp, sp=sp)
    return sum(v for k, v in parts.items() if k != "layers")


def block_bytes_run(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool) -> float:
    """One block's bytes as the run sent them: the step's tp bytes, less what lies outside
    the blocks, over the blocks."""
    return (tp_run_bytes(tp)[sp] - outside_blocks(tp, sp)) / ModelConfig.preset("tiny").n_layers


def tp_block_cases() -> list[tuple]:
    tiny, tokens = ModelConfig.preset("tiny"), TP_RUN["global_batch"] * TP_RUN["seq_len"]
    return [(tokens, tiny.dim, tp, 4, sp) for tp in (2, 4) for sp in (False, True)]


@exercise("tensor_parallel", "bug")
def check_tp_block_bytes(fn) -> Verdict:
    """fn(tokens, dim, tp, act_bytes, sp) -> one block's bytes: `buggy_tp_block_bytes`
    fixed. Compared with one step of `tiny` (float32, one micro-batch of 8 x 32 tokens) on
    2 and 4 gloo ranks, with and without SP: the tp bytes CommLog counted, less the
    embedding's, the head's, the loss's and the norms' (the chapter's formulas), per block."""
    call = lambda args: f"{yours(fn)}{args!r}"
    return compare_calls(fn, tp_block_cases(), block_bytes_run, 1e-9,
                         diagnosed(call, _tp_block_mistakes),
                         "tp_block_bytes agrees with the bytes the trainer's blocks sent, TP2 "
                         "and TP4, with and without SP.", call=call)


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


# ----------------------------------------------------------------- f and g, with autograd
def _mlp_fixture(step: int):
    """The same input and weights on every rank (one seed per step): x [4, 6], a block
    6 -> 8 -> 6 (A [8, 6] column-parallel, B [6, 8] row-parallel), and the output's
    upstream gradient."""
    gen = torch.Generator().manual_seed(100 + step)
    return (torch.randn(4, 6, generator=gen), torch.randn(8, 6, generator=gen),
            torch.randn(6, 8, generator=gen), torch.randn(4, 6, generator=gen))


def _mlp(x, a, b, dy, f=lambda t: t, g=lambda t: t):
    """relu(f(x) A^T) B^T, then g; backward from dy. Returns y and the three gradients."""
    x = x.clone().requires_grad_()
    y = g(torch.relu(f(x) @ a.T) @ b.T)
    y.backward(dy)
    return y.detach(), x.grad, a.grad, b.grad


def _f_and_g_worker(f, g):
    rank, n = dist.get_rank(), dist.get_world_size()
    _, a_full, b_full, _ = _mlp_fixture(0)
    a_full, b_full = a_full.clone(), b_full.clone()
    for step in range(STEPS):
        x, _, _, dy = _mlp_fixture(step)
        a = a_full.chunk(n, dim=0)[rank].clone().requires_grad_()      # my hidden units
        b = b_full.chunk(n, dim=1)[rank].clone().requires_grad_()      # their columns of B
        want = _mlp(x, a_full.clone().requires_grad_(), b_full.clone().requires_grad_(), dy)
        got = _mlp(x, a, b, dy, f, g)
        pairs = [("y", got[0], want[0]), ("x.grad (f's backward)", got[1], want[1]),
                 ("A_r.grad", got[2], want[2].chunk(n, dim=0)[rank]),
                 ("B_r.grad", got[3], want[3].chunk(n, dim=1)[rank])]
        for name, mine, ref in pairs:
            problem = at(step, rank, first_difference(mine, ref, name, FLOAT32))
            if problem:
                return problem
        a_full -= LR * want[2]                     # the single device's SGD step
        b_full -= LR * want[3]
    return None


@exercise("tensor_parallel", "implement")
def check_f_and_g(f, g) -> Verdict:
    """f(x) and g(x): Megatron's conjugate operators as autograd functions over the default
    group (f: forward identity, backward all-reduce; g: forward all-reduce, backward
    identity). Run as relu(f(x) A_r^T) B_r^T -> g on 2 gloo ranks for two SGD steps, against
    one device: the output, x's gradient and each rank's slice of the weight gradients."""
    if f is None or g is None:
        return Verdict(None, "Not answered yet: write f and g, pass them here, run again.")
    problem = function_given(g)
    if problem is not None:
        return problem
    return on_ranks(2, functools.partial(_f_and_g_worker, g=g), f,
        "your f and g give one device's output and gradients, at every step, on 2 gloo ranks.")


# ----------------------------------------------------------------- find the bug: the bias
def buggy_row_parallel_linear(x_shard, w_shard, bias, g):
    """A row-parallel linear with a bug (the exercise): y = x W^T + b from this rank's
    slice of the input features; `g` sums the ranks' partial products (forward all-reduce,
    backward identity)."""
    return g(x_shard @ w_shard.T + bias)


def _row_parallel_worker(fn):
    rank, n = dist.get_rank(), dist.get_world_size()
    axis = ProcessGrid(tp=n, rank=rank).init_groups().tp
    g = functools.partial(reduce_from_group, axis=axis)
    gen = torch.Generator().manual_seed(7)
    w_full, bias_full = torch.randn(5, 6, generator=gen), torch.randn(5, generator=gen)
    for step in range(STEPS):
        x, dy = torch.randn(3, 6, generator=gen), torch.randn(3, 5, generator=gen)
        ref = [t.clone().requires_grad_() for t in (x, w_full, bias_full)]
        (ref[0] @ ref[1].T + ref[2]).backward(dy)
        y_ref = (x @ w_full.T + bias_full)
        mine = [x.chunk(n, dim=1)[rank].clone().requires_grad_(),
                w_full.chunk(n, dim=1)[rank].clone().requires_grad_(), bias_full.clone().requires_grad_()]
        y = fn(*mine, g)
        y.backward(dy)
        pairs = [("y", y.detach(), y_ref), ("x_shard.grad", mine[0].grad, ref[0].grad.chunk(n, dim=1)[rank]),
                 ("w_shard.grad", mine[1].grad, ref[1].grad.chunk(n, dim=1)[rank]),
                 ("bias.grad", mine[2].grad, ref[2].grad)]
        for name, got, want in pairs:
            problem = at(step, rank, first_difference(got, want, name, FLOAT32))
            if problem:
                return problem
        w_full, bias_full = w_full - LR * ref[1].grad, bias_full - LR * ref[2].grad
    return None


@exercise("tensor_parallel", "bug")
def check_row_parallel_linear(fn) -> Verdict:
    """fn(x_shard, w_shard, bias, g) -> y: `buggy_row_parallel_linear`, fixed. Run on 2 gloo
    ranks for two SGD steps against one device's x W^T + b (output and every gradient)."""
    return on_ranks(2, _row_parallel_worker, fn,
        "your row-parallel linear gives one device's output and gradients on 2 gloo ranks.")


# ----------------------------------------------------------------- predict, then run
@functools.lru_cache(maxsize=8)
def measured_tp_bytes(tp: int, sp: bool, global_batch: int = 8, seq_len: int = 32) -> int:
    """Run one step of `tiny` on `tp` gloo ranks and return the bytes rank 0 put on the wire
    for the tp axis (`wire.steps_by_axis`)."""
    with steps_by_axis(Trainer):
        out = train(TrainConfig(parallel=ParallelConfig(tp=tp, sp=sp), steps=1, progress=False,
                                global_batch=global_batch, seq_len=seq_len))
    return out["records"][-1]["wire"]["tp"]


def _ring_tp_bytes(tp: int, sp: bool) -> int:
    """The chapter's count, under the ring formula: what CommLog files, not what gloo sends."""
    return tp_wire_bytes_per_step(ModelConfig.preset("tiny"), 8, 32, tp, sp=sp)


@exercise("tensor_parallel", "predict")
def check_predict_tp_bytes(prediction, tp: int = 4, sp: bool = True, reveal: bool = False) -> Verdict:
    """Predict the bytes one TP rank sends in a step of `tiny` (8 sequences of 32 tokens,
    one micro-batch, float32) with --tp `tp` (and --sp); then minipar runs it on gloo and
    reads what rank 0 wrote to its sockets. Within 3%: gloo's headers, about a kilobyte on
    each of the step's many small collectives."""
    return predicted(prediction, lambda: measured_tp_bytes(tp, sp), f"the TP bytes per rank of --tp {tp}"
                     + (" --sp" if sp else ""), 0.03, HEADERS_WHY, unit="B", reveal=reveal,
                     hints=[(_ring_tp_bytes(tp, sp), RING_NOT_GLOO)] if sp else [])


# ---------------------------------------------------------------- predict, then replay
@exercise("tensor_parallel", "predict")
def check_replayed_tp_exposure(predicted_ms, reveal: bool = False) -> Verdict:
    """Predict how long rank 0 waits for TP per step (exposed time, ms) with plain SP
    (`--tp 2 --sp`, no overlap) replayed at Llama 3 8B's shapes on H100s, the pair on one
    server's NVLink; the check replays it (`teach.replays`, the chapter's figure)."""
    def clues(truth):
        ring = replays.replayed("tensor_parallel_overlap").exposed_s["tp"] * 1e3
        hints = [(truth / 2, "that is the forward's collectives alone: the backward all-gathers "
                             "and reduce-scatters as many bytes again."),
                 (ring, "that is with the collective matmul; without it every all-gather and "
                        "reduce-scatter stops the rank.")]
        return hints, (f" With --tp-overlap the replay exposes {ring:.2g} ms: each ring step's "
                       "transfer runs while the matmul of the chunk already there computes, and "
                       "only what outlasts that matmul waits.")
    return replayed_exposure(predicted_ms, reveal, "plain SP's exposed TP time per step",
                             "tensor_parallel", "tp", clues)


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_row_parallel_linear",
                                                          "buggy_tp_block_bytes"]
