"""Every chapter's exercises, checked: the `check_*` functions that end each notebook.

Every `check_*` compares a reader's answer (a number) or implementation (a function) with
an independent computation in minipar: a formula, the pipeline simulator, or torch itself
on two gloo ranks. It returns a `Verdict`, whose text a notebook shows: "Not answered yet"
for None, "Correct" for a right answer, and for a wrong one what is off, not the solution.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist

from ..checkpoint import expected_waste
from ..config import ModelConfig
from ..flops import dense_flops_per_token, flops_per_token, mfu
from ..formulas import dp_bytes, wire_bytes
from ..grid import Axis, ProcessGrid
from ..launch import RankFailed, run_local
from ..parallel.context import attention_work, contiguous_chunks, shard_for_context_parallel
from ..parallel.schedules import make_schedule, simulate

NOT_ANSWERED = "Not answered yet: replace None with your answer and run the cell again."


class Verdict:
    """The outcome of a check: ok is True (right), False (wrong) or None (no answer yet)."""

    def __init__(self, ok: bool | None, message: str):
        self.ok, self.message = ok, message

    def __bool__(self) -> bool:      # `assert check_x(...)` passes only when it is right
        return self.ok is True

    def __repr__(self) -> str:       # what a notebook cell shows
        return self.message


def _right(message: str) -> Verdict:
    return Verdict(True, "Correct! " + message)


def _wrong(message: str) -> Verdict:
    return Verdict(False, "Not quite: " + message)


def _number(answer, expected: float, what: str, rel: float = 1e-3, hints=()) -> Verdict:
    """Compare a numeric answer with `expected` to relative tolerance `rel`.

    hints: (value, message) pairs for the usual mistakes; a wrong answer near one of them
    gets that message, any other a "too high / too low" with the ratio.
    """
    if answer is None:
        return Verdict(None, NOT_ANSWERED)
    try:
        a = float(answer)
    except (TypeError, ValueError):
        return _wrong(f"{what} should be a number, got {answer!r}.")
    if math.isclose(a, expected, rel_tol=rel, abs_tol=1e-12):
        return _right(f"({what})")   # not the number: the page shows this under the question
    for value, message in hints:
        if math.isclose(a, value, rel_tol=rel, abs_tol=1e-12):
            return _wrong(message)
    side = "too high" if a > expected else "too low"
    ratio = a / expected if expected else float("inf")
    return _wrong(f"{what} = {answer} is {side} (by a factor of {ratio:.3g}).")


def _function(fn) -> Verdict | None:
    if fn is None:
        return Verdict(None, "Not answered yet: write the function, pass it here, run again.")
    if not callable(fn):
        return _wrong(f"expected a function, got {fn!r}.")
    return None


def _compare_calls(fn, cases, reference, rel_tol: float, mismatch, success: str,
                   call=None) -> Verdict:
    """Call the reader's fn(*args) and reference(*args) for each args in `cases`. Wrong at the
    first call that raises, or whose number is off by more than rel_tol (mismatch(args, got,
    want) says how); right, saying `success`, when every case agrees. call(args) names a call
    in the messages (default: fn(args...))."""
    problem = _function(fn)
    if problem is not None:
        return problem
    for args in cases:
        want = reference(*args)
        name = call(args) if call else f"fn{tuple(args)}"
        try:
            got = float(fn(*args))
        except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
            return _wrong(f"{name} raised {type(e).__name__}: {e}")
        if not math.isclose(got, want, rel_tol=rel_tol):
            return _wrong(mismatch(args, got, want))
    return _right(success)


def _on_two_ranks(worker, fn, success: str) -> Verdict:
    """Run `worker(fn)` on 2 local gloo ranks; it returns None (fine) or what went wrong."""
    problem = _function(fn)
    if problem is not None:
        return problem
    try:
        problems = run_local(_quiet, 2, worker, fn, backend="gloo", timeout_s=30.0)
    except RankFailed as e:
        return _wrong(f"your function raised on rank {e.rank}: {str(e).strip().splitlines()[0]}")
    problems = [(r, p) for r, p in enumerate(problems) if p]
    if problems:
        r, p = problems[0]
        return _wrong(f"on rank {r}, {p}")
    return _right(success)


def _quiet(worker, fn):
    warnings.simplefilter("ignore", FutureWarning)   # torch's deprecation notes, per rank
    return worker(fn)


def _close(got, want, what: str) -> str | None:
    """None when tensors match (float32 tolerance), else what differs."""
    if not isinstance(got, torch.Tensor):
        return f"{what} should be a tensor, got {type(got).__name__}."
    if got.shape != want.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}."
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
        err = (got - want).abs().max().item()
        return f"{what} has the right shape but wrong values (max abs error {err:.3g})."
    return None


# ================================================================== collectives
def check_ring_allreduce_bytes(n: int, size: int, answer) -> Verdict:
    """Bytes one rank sends in a ring all-reduce of `size` bytes over `n` ranks."""
    want = wire_bytes("all_reduce", n, size)
    return _number(answer, want, "bytes sent per rank", rel=1e-6, hints=[
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
    return _close(got, want, "the result")


def check_allreduce(fn) -> Verdict:
    """fn(t) -> the sum of t over all ranks, from a reduce-scatter and an all-gather."""
    return _on_two_ranks(_allreduce_worker, fn,
        "reduce-scatter + all-gather is an all-reduce (on 2 gloo ranks, against the sum).")


# ================================================================== data parallelism
def check_zero_bytes(n_params: int, n: int, zero: int, answer, grad_bytes: int = 4,
                     param_bytes: int = 4) -> Verdict:
    """Bytes one rank sends per step under ZeRO stage `zero` (one micro-batch)."""
    want = dp_bytes(n_params, n, zero, 1, grad_bytes, param_bytes)
    g = n_params * grad_bytes
    return _number(answer, want, f"ZeRO-{zero} bytes per rank", rel=1e-6, hints=[
        (g, "that is the size of the gradients; count what the ring sends over n ranks."),
        ((n - 1) * g / n, "that is only the reduce-scatter of the gradients; the updated "
                          "parameter shards must come back to every rank too."),
    ])


def _average_gradients_worker(fn):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 4)            # the global batch; this rank trains on x[rank]
    model(x[rank]).pow(2).mean().backward()
    fn(model)
    reference(x.reshape(16, 4)).pow(2).mean().backward()   # one device, the whole batch
    for name, p in model.named_parameters():
        problem = _close(p.grad, dict(reference.named_parameters())[name].grad,
                         f"the gradient of {name}")
        if problem:
            return problem + " It should equal the gradient of the whole batch on one device."
    return None


def check_average_gradients(fn) -> Verdict:
    """fn(model) replaces every p.grad with its mean over the ranks."""
    return _on_two_ranks(_average_gradients_worker, fn,
        "the averaged gradients equal one device's gradient of the whole batch (2 gloo ranks).")


# ================================================================== tensor parallelism
def check_tp_allreduce_bytes(tp: int, b: int, s: int, h: int, bytes_per_elem: int, answer) -> Verdict:
    """Wire bytes per rank of the one all-reduce after a row-parallel layer: [b, s, h]."""
    size = b * s * h * bytes_per_elem
    want = wire_bytes("all_reduce", tp, size)
    return _number(answer, want, "bytes sent per rank", rel=1e-6, hints=[
        (size, "that is the activation's size; the ring all-reduce sends 2(n-1)/n of it."),
        (size / tp, "the partial sums are full-size [b, s, h] on every rank, not 1/tp of it."),
    ])


def _column_parallel_worker(fn):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, w = torch.randn(3, 5), torch.randn(8, 5)       # nn.Linear's layout: [out, in]
    shard = w.chunk(n, dim=0)[rank].clone()
    return _close(fn(x, shard), x @ w.T, "column_parallel(x, w_shard)")


def check_column_parallel(fn) -> Verdict:
    """fn(x, w_shard) -> x @ W.T, where this rank holds rows `w_shard` of W (dim 0 split)."""
    return _on_two_ranks(_column_parallel_worker, fn,
        "your column-parallel linear matches x @ W.T on 2 gloo ranks.")


# ================================================================== pipeline parallelism
def check_bubble(p: int, m: int, answer, schedule: str = "1f1b") -> Verdict:
    """The bubble fraction of `schedule` with p stages and m micro-batches (t_b = 2 t_f)."""
    want = simulate(make_schedule(schedule, p, m)).bubble_fraction
    return _number(answer, want, "the bubble fraction", rel=1e-3, hints=[
        ((p - 1) / m, "that is idle over busy time; the fraction is idle over the whole "
                      "area, makespan x ranks."),
        ((p - 1) / (m + p), "nearly: the pipeline fills and drains over p-1 slots."),
    ])


def check_interleaved_bubble(fn) -> Verdict:
    """fn(p, m, v) -> the bubble fraction of interleaved 1F1B, v chunks per rank."""
    return _compare_calls(
        fn, [(2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 6, 1)],
        lambda p, m, v: simulate(make_schedule("interleaved", p, m, v)).bubble_fraction, 1e-6,
        lambda args, got, want: f"fn{args} = {got:.4f}, but the simulated schedule idles "
                                f"{want:.4f} of the time.",
        "your formula matches the simulated interleaved schedules.")


# ================================================================== context parallelism
def check_contiguous_imbalance(seq_len: int, cp: int, answer) -> Verdict:
    """Busiest over least busy rank's attention work under the contiguous (naive) split."""
    work = attention_work(seq_len, cp, contiguous_chunks)
    want = max(work) / min(work)
    return _number(answer, want, "the imbalance", rel=1e-3, hints=[
        (float(cp), "close, but the diagonal blocks are only half computed (a triangle "
                    "with its diagonal): count scores, c(c+1)/2 per diagonal block."),
        (2 * cp - 1.0, "count every rank's blocks, diagonal ones as c(c+1)/2 scores."),
    ])


def check_zigzag(fn) -> Verdict:
    """fn(seq_len, rank, cp) -> the positions this CP rank holds, in the order it holds them."""
    problem = _function(fn)
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
                return _wrong(f"fn({seq_len}, {rank}, {cp}) raised {type(e).__name__}: {e}")
            if got != want:
                if sorted(got) == sorted(want):
                    return _wrong(f"fn({seq_len}, {rank}, {cp}) has the right positions in the "
                                  f"wrong order: the early chunk comes first.")
                return _wrong(f"fn({seq_len}, {rank}, {cp}) = {got}: not the two chunks of "
                              f"seq_len/(2 cp) tokens this rank should hold.")
    return _right("your layout matches shard_for_context_parallel for every rank.")


# ================================================================== 4D
def check_coords(rank: int, tp: int, cp: int, pp: int, dp: int, answer) -> Verdict:
    """answer: {"tp": .., "cp": .., "pp": .., "dp": ..} of `rank` in the [TP, CP, PP, DP] order."""
    if answer is None:
        return Verdict(None, NOT_ANSWERED)
    want = ProcessGrid(tp, cp, pp, dp).coords(rank)
    try:
        got = {a: int(answer[a]) for a in want}
    except (TypeError, KeyError, ValueError):
        return _wrong("answer with a dict with keys 'tp', 'cp', 'pp', 'dp'.")
    if got == want:
        return _right(f"(the coordinates of rank {rank})")
    off = [a for a in want if got[a] != want[a]]
    return _wrong(f"the {', '.join(off)} coordinate{'s are' if len(off) > 1 else ' is'} off; "
                  f"TP varies fastest, then CP, PP, DP.")


def check_dp_group(fn) -> Verdict:
    """fn(rank, tp, cp, pp, dp) -> the global ranks of `rank`'s DP group, sorted."""
    problem = _function(fn)
    if problem is not None:
        return problem
    for sizes in [(2, 1, 1, 2), (2, 2, 2, 2), (8, 1, 4, 3)]:
        grid = ProcessGrid(*sizes)
        for rank in range(0, grid.world_size, 5):
            want = list(grid.group_ranks("dp", rank))
            try:
                got = sorted(int(r) for r in fn(rank, *sizes))
            except Exception as e:   # noqa: BLE001
                return _wrong(f"fn({rank}, {', '.join(map(str, sizes))}) raised "
                              f"{type(e).__name__}: {e}")
            if got != want:
                return _wrong(f"fn({rank}, {', '.join(map(str, sizes))}) = {got}: a DP group "
                              f"holds {sizes[3]} ranks that differ only in their dp coordinate.")
    return _right("your DP groups match ProcessGrid's.")


# ================================================================== MFU
def check_mfu(model: ModelConfig, seq_len: int, tokens_per_s: float, n_gpus: int,
              peak_flops: float, answer) -> Verdict:
    """MFU (a fraction, PaLM's 6N + 12 L h s convention) of n_gpus processing tokens_per_s."""
    want = mfu(tokens_per_s, model, seq_len, peak_flops, n_gpus)
    dense = tokens_per_s * dense_flops_per_token(model) / (peak_flops * n_gpus)
    return _number(answer, want, "MFU", rel=5e-3, hints=[
        (100 * want, "give MFU as a fraction (0.43), not a percentage."),
        (dense, "that leaves out attention: PaLM's convention adds 12 L h s per token."),
        (want * n_gpus, "the peak is per GPU: divide by all the GPUs' peak."),
    ])


def check_flops_per_token(fn) -> Verdict:
    """fn(model, seq_len) -> model FLOPs per token, PaLM's convention."""
    cases = [(ModelConfig(), 128), (ModelConfig(tie_embeddings=True), 64),
             (ModelConfig.preset("llama3-405b"), 8192)]
    return _compare_calls(
        fn, cases, flops_per_token, 1e-9,
        lambda args, got, want: f"for {args[0].name} at seq_len {args[1]} you count {got:.4g} "
                                f"FLOPs per token, off by a factor of {got / want:.4g}.",
        "6 N + 12 L h s, for three models.", call=lambda args: f"fn({args[0].name}, {args[1]})")


# ================================================================== failures
def check_young_daly_interval(write_s: float, mtbf_s: float, answer) -> Verdict:
    """Young's optimal checkpoint interval, in seconds."""
    want = math.sqrt(2 * write_s * mtbf_s)
    return _number(answer, want, "the interval in seconds", rel=5e-3, hints=[
        (math.sqrt(write_s * mtbf_s), "missing a factor: the interval is sqrt(2 C M)."),
        (want / 60, "give the interval in seconds, not minutes."),
    ])


def check_expected_waste(fn) -> Verdict:
    """fn(interval_s, write_s, mtbf_s, restart_s) -> fraction of time lost (first order)."""
    return _compare_calls(
        fn, [(600.0, 30.0, 3 * 3600.0, 0.0), (1200.0, 60.0, 11134.0, 300.0),
             (60.0, 5.0, 600.0, 20.0)], expected_waste, 1e-9,
        lambda args, got, want: f"fn{args} = {got:.5f}, expected another value (off by "
                                f"{got - want:+.5f}); count the writes, the restart and the "
                                f"lost work.",
        "your waste model matches minipar.checkpoint.expected_waste.")


__all__ = ["Verdict"] + [n for n in dir() if n.startswith("check_")]
