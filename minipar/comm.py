"""Every collective in minipar goes through this file, and every one is counted.

`LOG`, a `CommLog`, records for each (axis, op): calls, the payload bytes this rank handed to
the collective, and the bytes this rank puts on the wire under the ring algorithm:

    all-reduce      2 (n-1)/n * S     (reduce-scatter, then all-gather, each (n-1)/n * S)
    all-gather        (n-1)/n * S     (S = the gathered result)
    reduce-scatter    (n-1)/n * S     (S = the full input)
    send                        S     (on the sender; the receiver sends nothing)

Counting the algorithm's bytes (not whatever gloo does internally) is what lets the book's
formulas and the measured numbers agree on CPU and on NCCL alike.

The second half holds the autograd-aware collectives the parallel axes are built from:
Megatron's conjugate pair f (identity forward, all-reduce backward) and g (all-reduce forward,
identity backward), and the sequence-parallel gather / reduce-scatter pair.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .grid import Axis


# ----------------------------------------------------------------------------- the log
@dataclass
class OpStats:
    calls: int = 0
    payload_bytes: int = 0
    wire_bytes: int = 0
    seconds: float = 0.0


def wire_bytes(op: str, n: int, size: int) -> int:
    """Bytes one rank sends for `op` over n ranks on a message of `size` bytes (ring)."""
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1) * size // n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * size // n
    if op == "send":
        return size
    if op == "recv":
        return 0
    if op == "broadcast":   # pipelined ring broadcast: every rank but the last forwards S
        return (n - 1) * size // n
    raise ValueError(f"unknown collective {op!r}")


class CommLog:
    """Per-process record of communication, grouped by axis and op."""

    def __init__(self):
        self.stats: dict[tuple[str, str], OpStats] = defaultdict(OpStats)
        self.enabled = True

    def record(self, axis: str, op: str, n: int, payload: int, full: int, seconds: float = 0.0):
        if not self.enabled:
            return
        st = self.stats[(axis, op)]
        st.calls += 1
        st.payload_bytes += payload
        st.wire_bytes += wire_bytes(op, n, full)
        st.seconds += seconds

    def reset(self):
        self.stats.clear()

    def summary(self) -> dict:
        """{axis: {op: {calls, payload_bytes, wire_bytes}}}: the `comm` key of `--log-json`."""
        out: dict = {}
        for (axis, op), st in sorted(self.stats.items()):
            out.setdefault(axis, {})[op] = {"calls": st.calls, "payload_bytes": st.payload_bytes,
                                            "wire_bytes": st.wire_bytes}
        return out

    def total(self, axis: str | None = None, key: str = "wire_bytes") -> int:
        return sum(getattr(st, key) for (a, _), st in self.stats.items() if axis in (None, a))


LOG = CommLog()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _timed(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


# ------------------------------------------------------------------- plain collectives
# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# All reductions are SUM: on gloo, ReduceOp.AVG was refused or silently summed in several
# torch releases (pytorch#162338), so callers divide themselves.
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def all_reduce(t: torch.Tensor, axis: Axis, op: str = "sum", async_op: bool = False):
    """In-place all-reduce of `t` over `axis`. With async_op, returns the work handle."""
    if axis.size == 1:
        return None
    work, sec = _timed(dist.all_reduce, t, op=_OPS[op], group=axis.group, async_op=async_op)
    LOG.record(axis.log_as, "all_reduce", axis.size, _nbytes(t), _nbytes(t), sec)
    return work if async_op else t


def all_gather(t: torch.Tensor, axis: Axis, dim: int = 0, async_op: bool = False):
    """Concatenate every rank's `t` along `dim` (rank order). Returns the gathered tensor,
    or (tensor, work) with async_op."""
    if axis.size == 1:
        return _Deferred(None, lambda: t) if async_op else t
    inp = t.movedim(dim, 0).contiguous()
    out = torch.empty((axis.size * inp.shape[0], *inp.shape[1:]), dtype=t.dtype, device=t.device)
    work, sec = _timed(_all_gather_flat, out, inp, group=axis.group, async_op=async_op)
    LOG.record(axis.log_as, "all_gather", axis.size, _nbytes(inp), _nbytes(out), sec)

    def finish():
        return out.movedim(0, dim)
    if async_op:
        return _Deferred(work, finish)
    return finish()


def reduce_scatter(t: torch.Tensor, axis: Axis, dim: int = 0, async_op: bool = False):
    """Sum `t` over ranks and keep this rank's 1/n slice along `dim`."""
    if axis.size == 1:
        return _Deferred(None, lambda: t) if async_op else t
    if t.shape[dim] % axis.size:
        raise ValueError(f"reduce_scatter over {axis.name}: dim {dim} of size {t.shape[dim]} "
                         f"is not divisible by {axis.size}")
    inp = t.movedim(dim, 0).contiguous()
    out = torch.empty((inp.shape[0] // axis.size, *inp.shape[1:]), dtype=t.dtype, device=t.device)
    work, sec = _timed(_reduce_scatter_flat, out, inp, group=axis.group, async_op=async_op)
    LOG.record(axis.log_as, "reduce_scatter", axis.size, _nbytes(inp), _nbytes(inp), sec)

    def finish():
        return out.movedim(0, dim)
    if async_op:
        return _Deferred(work, finish)
    return finish()


def broadcast(t: torch.Tensor, axis: Axis, src_index: int = 0):
    """Copy the tensor of the rank at position `src_index` of `axis` to all its ranks."""
    if axis.size == 1:
        return t
    _, sec = _timed(dist.broadcast, t, src=axis.global_rank(src_index), group=axis.group)
    LOG.record(axis.log_as, "broadcast", axis.size, _nbytes(t), _nbytes(t), sec)
    return t


class _Deferred:
    """An async collective whose result needs a last reshaping once it has arrived."""

    def __init__(self, work, finish):
        self.work, self._finish = work, finish

    def wait(self):
        if self.work is not None:
            self.work.wait()
        return self._finish()


# ---------------------------------------------------------------------------- p2p
def exchange(sends=(), recvs=(), axis_name: str = "pp"):
    """Post all sends and receives at once and wait for them: [(tensor, global_peer_rank)],
    or [(tensor, global_peer_rank, tag)] where a pair of ranks exchanges several messages
    that must not be confused (a pipeline's activations and gradients).

    Posting both directions in one batch is what makes a pipeline or a ring unable to
    deadlock: no rank blocks in a send while its peer blocks in another send.
    """
    ops = _p2p_ops(sends, recvs)
    if not ops:
        return
    t0 = time.perf_counter()
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    sec = time.perf_counter() - t0
    for t, *_ in sends:
        LOG.record(axis_name, "send", 2, _nbytes(t), _nbytes(t), sec / max(len(sends), 1))
    for t, *_ in recvs:
        LOG.record(axis_name, "recv", 2, _nbytes(t), _nbytes(t), 0.0)


def _p2p_ops(sends, recvs):
    """P2POps for [(tensor, peer)] or [(tensor, peer, tag)]: sends first, then receives."""
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer, tag=tag[0] if tag else 0)
           for t, peer, *tag in sends]
    return ops + [dist.P2POp(dist.irecv, t, peer, tag=tag[0] if tag else 0)
                  for t, peer, *tag in recvs]


def exchange_async(sends=(), recvs=(), axis_name: str = "pp"):
    """Like `exchange`, but return the works: the caller waits when it needs the data
    (and keeps each sent tensor alive until then)."""
    ops = _p2p_ops(sends, recvs)
    for t, *_ in sends:
        LOG.record(axis_name, "send", 2, _nbytes(t), _nbytes(t))
    for t, *_ in recvs:
        LOG.record(axis_name, "recv", 2, _nbytes(t), _nbytes(t))
    return dist.batch_isend_irecv(ops) if ops else []


# ------------------------------------------------------------- autograd collectives
class _CopyToGroup(torch.autograd.Function):
    """Megatron's f: forward identity, backward all-reduce (input replicated, grads partial)."""

    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        return all_reduce(g, ctx.axis), None


class _ReduceFromGroup(torch.autograd.Function):
    """Megatron's g: forward all-reduce (partial sums), backward identity."""

    @staticmethod
    def forward(ctx, x, axis):
        return all_reduce(x.contiguous().clone(), axis)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromGroup(torch.autograd.Function):
    """Forward all-gather along `dim`; backward reduce-scatter (each rank's slice of the
    summed gradient). Sequence parallelism's entry into a column-parallel block."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return all_gather(x, axis, dim)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter(g, ctx.axis, ctx.dim), None, None


class _ReduceScatterToGroup(torch.autograd.Function):
    """Forward reduce-scatter along `dim`; backward all-gather. Sequence parallelism's exit
    from a row-parallel block: partial sums become this rank's slice of the total."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return reduce_scatter(x, axis, dim)

    @staticmethod
    def backward(ctx, g):
        return all_gather(g, ctx.axis, ctx.dim), None, None


class _SplitToGroup(torch.autograd.Function):
    """Forward keeps this rank's slice along `dim` (no communication); backward all-gathers."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return x.chunk(axis.size, dim=dim)[axis.rank].contiguous()

    @staticmethod
    def backward(ctx, g):
        return all_gather(g, ctx.axis, ctx.dim), None, None


class _AllReduceSumGrad(torch.autograd.Function):
    """All-reduce in forward and in backward: a sum over ranks that every rank then uses
    (e.g. a loss total), whose gradient each rank must also see summed."""

    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return all_reduce(x.contiguous().clone(), axis)

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.contiguous().clone(), ctx.axis), None


def copy_to_group(x, axis: Axis):
    return x if axis.size == 1 else _CopyToGroup.apply(x, axis)


def reduce_from_group(x, axis: Axis):
    return x if axis.size == 1 else _ReduceFromGroup.apply(x, axis)


def gather_from_group(x, axis: Axis, dim: int):
    return x if axis.size == 1 else _GatherFromGroup.apply(x, axis, dim)


def reduce_scatter_to_group(x, axis: Axis, dim: int):
    return x if axis.size == 1 else _ReduceScatterToGroup.apply(x, axis, dim)


def split_to_group(x, axis: Axis, dim: int):
    return x if axis.size == 1 else _SplitToGroup.apply(x, axis, dim)


def all_reduce_with_grad(x, axis: Axis):
    return x if axis.size == 1 else _AllReduceSumGrad.apply(x, axis)


class paused:
    """`with comm.paused():` — collectives inside are not recorded (e.g. logging metrics)."""

    def __enter__(self):
        self.was, LOG.enabled = LOG.enabled, False

    def __exit__(self, *exc):
        LOG.enabled = self.was
