"""The exercises of the collectives chapter, checked (see core.py for how)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...comm import LOG, all_gather, all_reduce, exchange, reduce_scatter
from ...formulas.collectives import wire_bytes
from ...grid import ProcessGrid
from ...launch import run_local
from .core import Tolerance, Verdict, exercise, first_difference, number, on_ranks, predicted


@exercise("collectives", "number")
def check_ring_allreduce_bytes(n: int, size: int, answer) -> Verdict:
    """Bytes one rank sends in a ring all-reduce of `size` bytes over `n` ranks."""
    want = wire_bytes("all_reduce", n, size)
    return number(answer, want, "the bytes sent per rank", rel=1e-6, unit="B", hints=[
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
    return first_difference(got, want, "the result")


@exercise("collectives", "implement")
def check_allreduce(fn) -> Verdict:
    """fn(t) -> the sum of t over all ranks, from a reduce-scatter and an all-gather."""
    return on_ranks(2, _allreduce_worker, fn,
        "reduce-scatter + all-gather is an all-reduce (on 2 gloo ranks, against the sum).")




# ---------------------------------------------------------------- a ring from sends
def _ring_exchange(sent: list):
    """exchange(send_tensor, recv_tensor): send to rank r+1 and receive from r-1 at once
    (both posted in one batch, so no rank can block the ring); counts the bytes sent."""
    n, r = dist.get_world_size(), dist.get_rank()

    def exchange(send: torch.Tensor, recv: torch.Tensor):
        ops = [dist.P2POp(dist.isend, send.contiguous(), (r + 1) % n),
               dist.P2POp(dist.irecv, recv, (r - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        sent.append(send.numel() * send.element_size())
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


# ---------------------------------------------------------------- predict, then run
PREDICT_N, PREDICT_NUMEL = 4, 2**16          # float32: S = 256 KiB


def _logged_step(_):
    """What the prediction exercise runs: a reduce-scatter of S bytes, an all-gather back to
    S bytes, an all-reduce of S bytes and a send of S bytes to the next rank, through
    minipar.comm; returns CommLog's wire bytes of this rank."""
    grid = ProcessGrid(dp=dist.get_world_size(), rank=dist.get_rank()).init_groups()
    axis, x = grid.dp, torch.ones(PREDICT_NUMEL)
    LOG.reset()
    all_gather(reduce_scatter(x, axis), axis)
    all_reduce(x.clone(), axis)
    exchange(sends=[(x, axis.global_rank(axis.rank + 1))],
             recvs=[(torch.empty_like(x), axis.global_rank(axis.rank - 1))], axis_name="dp")
    return sum(s["wire_bytes"] for s in LOG.summary()["dp"].values())


def measured_step_bytes() -> int:
    """Run `_logged_step` on PREDICT_N gloo ranks; the wire bytes rank 0's CommLog counted."""
    return run_local(_logged_step, PREDICT_N, None, backend="gloo")[0]


@exercise("collectives", "predict")
def check_predict_step_bytes(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes one rank sends (CommLog's wire bytes) for the step of
    `_logged_step`, then run it on 4 gloo ranks and compare (ratio reported)."""
    return predicted(prediction, measured_step_bytes if measured is None else measured,
                     "the bytes one rank sent", rel=1e-9,
                     why="CommLog counts the ring formula's bytes exactly", unit="B", reveal=reveal)


__all__ = [n for n in dir() if n.startswith("check_")]
