"""The exercises of the collectives chapter, checked (see core.py for how)."""
from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from ...plan.formulas.collectives import wire_bytes
from ...trainer.comm import Axis, all_gather, all_reduce, nbytes, reduce_scatter, ring_exchange
from ...trainer import ring
from ...trainer.grid import ProcessGrid
from ...runtime.launch import run_local
from ...runtime.wire_meter import GLOO_WIRE, HEADER_BYTES, WIRE_GRID, measure, measure_axes
from .core import (Tolerance, Verdict, compare_calls, exercise, first_difference, on_ranks,
                   predicted, yours)


def diagnosed(call, mistakes):
    """A `compare_calls` mismatch for byte counts: the hint of the first usual mistake
    (mistakes(*args) -> (value, message) pairs; a value of None matches any number) whose
    value the reader's number matches (every one of them, when two mistakes give the same
    number), else which side of the truth it is on and by how much, never the truth itself
    as a number."""
    def mismatch(args, got, want):
        hints = [message for value, message in mistakes(*args)
                 if value is None or math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-9)]
        if hints:
            return f"{call(args)} returned {got:,.0f}: " + " Or: ".join(dict.fromkeys(hints))
        if want == 0:
            return f"{call(args)} returned {got:,.0f}, but here a rank sends nothing."
        side = "too high" if got > want else "too low"
        if 0.99 < got / want < 1.01:
            return f"{call(args)} returned {got:,.0f}, {side} by {abs(got - want):,.0f} bytes."
        ratio = got / want
        return (f"{call(args)} returned {got:,.0f}, {side} by a factor of "
                f"{max(ratio, 1 / ratio):.3g}." if got > 0 else
                f"{call(args)} returned {got:,.0f}, {side}.")
    return mismatch


def _bytes_sent_mistakes(op: str, n: int, size: int):
    f = (n - 1) / n
    if n == 1:
        return [(None, "with n = 1 there is no other rank: nothing goes on the wire.")]
    if op == "recv":
        return [(None, "count what a rank sends: a receive writes nothing to the wire (its "
                       "peer's send carried the bytes).")]
    if op == "send":
        return [(f * size, "a send is not a collective: the whole tensor goes to one peer."),
                (0, "the sender writes the whole tensor to the wire.")]
    phase = (2 if op == "all_reduce" else 1)
    mistakes = [(phase * size, "each phase takes n-1 steps, not n: the chunk a rank ends up "
                               "owning (or started with) never leaves it."),
                (phase * (n - 1) * size, "a rank sends one chunk of S/n per step, not the whole "
                                         "tensor (S is the full tensor: for an all-gather the "
                                         "gathered result, for a reduce-scatter the input).")]
    if op == "all_reduce":
        mistakes += [(f * size, "that is one phase (reduce-scatter or all-gather); an "
                                "all-reduce runs both."),
                     (size, "that is the payload each rank hands in; count what the ring "
                            "sends in its two phases.")]
    else:
        mistakes += [(2 * f * size, f"that is an all-reduce's count; a {op.replace('_', '-')} "
                                    "is one pass round the ring (or, for an all-to-all, one "
                                    "piece to each peer).")]
    return mistakes


# ---------------------------------------------------------------- find the bug: bytes per rank
def buggy_bytes_sent(op: str, n: int, size: int) -> float:
    """The bytes one rank sends for `op` over n ranks under the ring algorithm, S = `size`
    bytes (for an all-gather the gathered result), with two bugs (the exercise)."""
    passes = {"reduce_scatter": 1, "all_gather": 2, "all_reduce": 2}[op]
    return passes * n * size / n


RING_OPS = ("all_reduce", "reduce_scatter", "all_gather")
RING_NUMEL = 12 * 2**10          # float32 elements: divides by 2, 3 and 4


def _ring_sends(_):
    """On each rank: minipar's ring all-reduce (`trainer.ring`) of RING_NUMEL float32, each
    send counted as it is handed to the ring: the bytes of each step, in order."""
    grid = ProcessGrid(dp=dist.get_world_size(), rank=dist.get_rank()).init_groups()
    sent, exchange = [], ring.ring_exchange

    def counted(axis, *tensors):
        sent.append(sum(nbytes(t) for t in tensors))
        return exchange(axis, *tensors)
    ring.ring_exchange = counted
    try:
        ring.ring_all_reduce(torch.ones(RING_NUMEL), grid.dp)
    finally:
        ring.ring_exchange = exchange
    return sent


@functools.cache
def ring_bytes_run(n: int) -> dict:
    """{op: bytes rank 0 sent} in a ring all-reduce run on n gloo ranks, phase by phase:
    its first n-1 steps are a reduce-scatter, its last n-1 an all-gather."""
    steps = run_local(_ring_sends, n, None, backend="gloo")[0] if n > 1 else []
    half = len(steps) // 2
    return {"reduce_scatter": sum(steps[:half]), "all_gather": sum(steps[half:]),
            "all_reduce": sum(steps)}


BYTES_SENT_CASES = [(op, n, 4 * RING_NUMEL) for n in (4, 3, 2, 1) for op in RING_OPS]


@exercise("collectives", "bug")
def check_bytes_sent(fn) -> Verdict:
    """fn(op, n, size) -> the bytes one rank sends: `buggy_bytes_sent` fixed. Compared, for
    a reduce-scatter, an all-gather and an all-reduce over n = 1 to 4, with what rank 0
    hands to its sends in minipar's ring all-reduce (`trainer.ring`) run on n gloo ranks,
    counted step by step."""
    call = lambda args: f"{yours(fn)}{args!r}"
    return compare_calls(fn, BYTES_SENT_CASES, lambda op, n, size: ring_bytes_run(n)[op], 1e-9,
                         diagnosed(call, _bytes_sent_mistakes),
                         "bytes_sent agrees with the bytes the ring sent, every op, n from 1 "
                         "to 4.", call=call)


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
    return first_difference(got, want, "the result")


@exercise("collectives", "implement")
def check_allreduce(fn) -> Verdict:
    """fn(t) -> the sum of t over all ranks, from a reduce-scatter and an all-gather."""
    return on_ranks(2, _allreduce_worker, fn,
        "reduce-scatter + all-gather is an all-reduce (on 2 gloo ranks, against the sum).")




# ---------------------------------------------------------------- a ring from sends
def _ring_exchange(sent: list):
    """exchange(send_tensor, recv_tensor): one `comm.ring_exchange` over all the ranks (send
    to rank r+1, receive from r-1, posted in one batch), the received tensor copied into
    `recv`; counts the bytes sent."""
    ring = Axis("ring", tuple(range(dist.get_world_size())), dist.get_rank())

    def exchange(send: torch.Tensor, recv: torch.Tensor):
        (arrived,) = ring_exchange(ring, send).wait()
        recv.copy_(arrived)
        sent.append(nbytes(send))
    return exchange


def _ring_worker(fn):
    n, r = dist.get_world_size(), dist.get_rank()
    for numel in (4 * n, 12 * n):                       # 4 and 12 elements per chunk
        # small integers as floats: every order of summation gives the same bits
        xs = [torch.arange(numel, dtype=torch.float32) * (k + 1) - 7 * k for k in range(n)]
        sent: list = []
        real = {name: getattr(dist, name) for name in _FORBIDDEN}
        for name in _FORBIDDEN:
            setattr(dist, name, _forbidden(name))
        try:
            got = fn(xs[r].clone(), r, n, _ring_exchange(sent))
        finally:
            for name, f in real.items():
                setattr(dist, name, f)
        problem = first_difference(got, sum(xs), f"the sum ({numel} elements)", EXACT)
        if problem:
            return f"rank {r}: {problem}"
        budget = wire_bytes("all_reduce", n, numel * 4)
        if sum(sent) != budget:
            return (f"rank {r}: the sum is right, but this rank sent {sum(sent):,} bytes in "
                    f"{len(sent)} exchanges; a ring sends 2(n-1)/n S = {budget:,} bytes in "
                    f"2(n-1) = {2 * (n - 1)} exchanges of one chunk each.")
    return None


EXACT = Tolerance(0.0, 0.0, "exact: small integers sum exactly in float32, in any order")
_FORBIDDEN = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
              "all_gather_into_tensor", "broadcast", "reduce")


def _forbidden(name):
    def refuse(*a, **k):
        raise RuntimeError(f"dist.{name} is not allowed here: use only exchange(send, recv)")
    return refuse


@exercise("collectives", "implement")
def check_ring_all_reduce(fn) -> Verdict:
    """fn(x, rank, n, exchange) -> the sum of x over the n ranks, as a ring: exchange(send,
    recv) sends `send` to rank+1 and fills `recv` from rank-1. Runs on 4 gloo ranks against
    the sum (bitwise: the values are small integers), and counts the bytes sent."""
    return on_ranks(4, _ring_worker, fn,
        "your ring sums exactly and sends 2(n-1)/n S per rank (4 gloo ranks, two sizes).")


# ---------------------------------------------------------------- bytes on the wire


def _wire_rows(size: int) -> list[dict]:
    grid = ProcessGrid(**WIRE_GRID, rank=dist.get_rank()).init_groups()
    return measure_axes(grid.axes, size)


def wire_per_rank(size: int = 2**20) -> list[list[dict]]:
    """`wire.measure_axes` on the 2x2x2x2 grid's 16 gloo ranks: each rank's rows."""
    return run_local(_wire_rows, 16, size, backend="gloo")


def wire_table(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (axis, op): the fewest and the most bytes a rank measured, next to the
    ring formula's and gloo's rule, and the ratios the chapter shows (rounded to 0.01: the
    headers are a few KB on a MiB, so the ratios do not move from run to run)."""
    rows = []
    for i, row in enumerate(per_rank[0]):
        got = [r[i]["measured"] for r in per_rank]
        rows.append({**row, "measured": min(got), "most": max(got),
                     "measured/ring": round(max(got) / row["ring"], 2),
                     "measured/gloo": round(max(got) / row["gloo"], 2),
                     "algorithm": GLOO_WIRE[row["op"]][0]})
    return rows


# ---------------------------------------------------------------- what a check tells
HEADERS_WHY = f"the wire also carries gloo's headers, under {HEADER_BYTES // 1000} KB per collective"
WIRE_WHY = HEADERS_WHY + ", and the step's scalar all-reduces"
RING_NOT_GLOO = ("that is what the ring would send; the step runs on gloo. The collectives "
                 "chapter's 'Bytes on the wire, measured' shows where gloo's algorithm is not "
                 "the ring's.")


# ---------------------------------------------------------------- predict, then run
PREDICT_N, PREDICT_NUMEL = 4, 2**16          # float32: S = 256 KiB


def _wire_step(_):
    """What the prediction exercise runs: a reduce-scatter of S bytes, an all-gather back to
    S bytes, an all-reduce of S bytes and a send of S bytes to the next rank, through
    minipar.trainer.comm on gloo; returns the bytes this rank wrote to its sockets meanwhile."""
    grid = ProcessGrid(dp=dist.get_world_size(), rank=dist.get_rank()).init_groups()
    axis, x = grid.dp, torch.ones(PREDICT_NUMEL)

    def step():
        all_gather(reduce_scatter(x, axis), axis)
        all_reduce(x.clone(), axis)
        ring_exchange(axis, x).wait()
    dist.barrier()
    return measure(step)


def measured_step_bytes() -> int:
    """Run `_wire_step` on PREDICT_N gloo ranks; the bytes rank 0 put on the wire."""
    return run_local(_wire_step, PREDICT_N, None, backend="gloo")[0]


def _ring_step_bytes() -> int:
    """The step's bytes under the ring formula: what CommLog files, not what gloo sends."""
    n, s = PREDICT_N, PREDICT_NUMEL * 4
    return sum(wire_bytes(op, n, s) for op in ("reduce_scatter", "all_gather", "all_reduce", "send"))


@exercise("collectives", "predict")
def check_predict_step_bytes(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes one rank puts on the wire for the step of `_wire_step`, then run it
    on 4 gloo ranks and compare with what the rank wrote to its sockets (`wire.measure`)."""
    return predicted(prediction, measured_step_bytes if measured is None else measured,
                     "the bytes one rank sent", rel=0.01, unit="B", reveal=reveal,
                     why=HEADERS_WHY, hints=[(_ring_step_bytes(), RING_NOT_GLOO)])


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_bytes_sent"]
