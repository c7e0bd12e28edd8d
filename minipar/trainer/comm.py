"""Every collective in minipar goes through this file, and every one is counted.

Chapter "Collectives".

`LOG`, a `CommLog`, records for each (axis, op): calls, the payload bytes this rank handed to
the collective, and the bytes this rank puts on the wire under the ring algorithm:

    all-reduce      2 (n-1)/n * S     (reduce-scatter, then all-gather, each (n-1)/n * S)
    all-gather        (n-1)/n * S     (S = the gathered result)
    reduce-scatter    (n-1)/n * S     (S = the full input)
    send                        S     (on the sender; the receiver sends nothing)

What is measured here is which collectives run and their sizes; the wire bytes are derived
from those by the ring formula (not from whatever gloo does internally), so one run reports
the same numbers on CPU and on NCCL alike. What gloo really puts on the wire is measured by
`wire.py`: the ring's bytes, except for its reduce-scatter, which sends twice as much.

Every collective started with `async_op=True` returns a `Handle`: one type whose `wait()`
returns the result, whatever the collective. The autograd-aware collectives built on these
(Megatron's f and g, sequence parallelism's gather and scatter) are in `parallel/regions.py`;
the ring all-reduce written out with sends and receives (`ring_exchange`'s steps) is `ring.py`.
"""

import contextlib
from collections import defaultdict
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from ..plan.formulas.collectives import wire_bytes
from . import events


# ----------------------------------------------------------------------------- groups
@dataclass
class Axis:
    """One parallel axis as seen from one rank: its peers, its position, its process group."""

    name: str
    ranks: tuple[int, ...]        # global ranks in this group, in axis order
    rank: int                     # this rank's index inside the group
    group: object = None          # torch ProcessGroup (None: the default, whole world)
    log_as: str = ""              # the name CommLog files its traffic under (default: name)

    def __post_init__(self):
        self.log_as = self.log_as or self.name

    @property
    def size(self) -> int:
        return len(self.ranks)

    def global_rank(self, index: int) -> int:
        """The global rank of the peer at position `index` (mod size) of this axis."""
        return self.ranks[index % self.size]



# ----------------------------------------------------------------------------- the log
@dataclass
class OpStats:
    calls: int = 0
    payload_bytes: int = 0
    wire_bytes: int = 0


class CommLog:
    """Per-process count of communication, grouped by axis and op."""

    def __init__(self):
        self.stats: dict[tuple[str, str], OpStats] = defaultdict(OpStats)
        self.enabled = True

    def record(self, axis: str, op: str, n: int, payload: int, wire: int) -> bool:
        """Count one collective over n ranks that puts `wire` bytes on the wire. False
        while `paused`: then the collective is neither counted nor traced."""
        if not self.enabled:
            return False
        st = self.stats[(axis, op)]
        st.calls += 1
        st.payload_bytes += payload
        st.wire_bytes += wire
        return True

    def reset(self):
        self.stats.clear()

    def summary(self) -> dict:
        """{axis: {op: {calls, payload_bytes, wire_bytes}}}: the `comm` key of `--log-json`."""
        out: dict = {}
        for (axis, op), st in sorted(self.stats.items()):
            out.setdefault(axis, {})[op] = asdict(st)
        return out


LOG = CommLog()


def device() -> torch.device:
    """This rank's device: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def nbytes(*tensors) -> int:
    """The bytes of the tensors given (a None counts nothing)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _run(collective, axis: Axis, name: str, payload: int, full: int, finish, /, *args,
         async_op=False, wire: int | None = None, split_bytes=None, **kw):
    """Start one collective over `axis`; count it in `LOG` and note it in the event stream.
    Returns `finish()` once it has arrived, or with async_op a `Handle` whose wait() does.
    Its wire bytes: the ring formula on `full`, unless the caller knows them (`wire`)."""
    start = events.now()
    work = collective(*args, group=axis.group, async_op=async_op, **kw)
    wire = wire_bytes(name, axis.size, full) if wire is None else wire
    if LOG.record(axis.log_as, name, axis.size, payload, wire):
        extra = {} if split_bytes is None else {"split_bytes": split_bytes}
        events.collective(axis.log_as, name, axis.ranks, payload, wire, start,
                          work if async_op else None, **extra)
    return Handle([work], finish=finish) if async_op else finish()


def alone(axis: Axis, name: str, t: torch.Tensor, async_op: bool):
    """A collective over a group of one is `t` itself. A trace still notes it (0 bytes on
    the wire), where the program issued it: a replay that widens the axis times it there."""
    done = torch.futures.Future()
    done.set_result(t)
    events.collective(axis.log_as, name, axis.ranks, nbytes(t), 0, events.now(),
                      done if async_op else None)
    return Handle([done], result=t) if async_op else t


# ------------------------------------------------------------------- plain collectives
# All reductions are SUM and callers divide themselves: older torch releases refused
# ReduceOp.AVG on gloo (the pinned 2.13.0 accepts it), a sum works on every backend, and
# data parallelism divides by the global token count anyway, not by the number of ranks.
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def all_reduce(t: torch.Tensor, axis: Axis, op: str = "sum", async_op: bool = False):
    """In-place all-reduce of `t` over `axis`: returns `t`, or a `Handle` with async_op."""
    if axis.size == 1:
        return alone(axis, "all_reduce", t, async_op)
    return _run(dist.all_reduce, axis, "all_reduce", nbytes(t), nbytes(t), lambda: t, t,
                op=_OPS[op], async_op=async_op)


def all_gather(t: torch.Tensor, axis: Axis, dim: int = 0, async_op: bool = False):
    """Concatenate every rank's `t` along `dim` (rank order): the gathered tensor, or a
    `Handle` whose wait() returns it."""
    return _along_dim(dist.all_gather_single, "all_gather", t, axis, dim,
                      axis.size * t.shape[dim], async_op)


def reduce_scatter(t: torch.Tensor, axis: Axis, dim: int = 0, async_op: bool = False):
    """Sum `t` over ranks and keep this rank's 1/n slice along `dim` (or a `Handle`). Its
    callers make `dim` divisible by n: `--sp` needs the sequence divisible by `--tp`, ZeRO
    pads its buckets, and the gradient of an all-gather is as long as what it gathered."""
    return _along_dim(dist.reduce_scatter_single, "reduce_scatter", t, axis, dim,
                      t.shape[dim] // axis.size, async_op)


def _along_dim(collective, name: str, t: torch.Tensor, axis: Axis, dim: int, out_size: int,
               async_op: bool):
    """All-gather or reduce-scatter `t` along `dim`, `out_size` long in the result. torch's
    collectives work along dim 0 of a contiguous tensor: `dim` goes to the front and back.
    The ring formula's size is the larger side: the gathered result, or the full input."""
    if axis.size == 1:
        return alone(axis, name, t, async_op)
    inp = t.movedim(dim, 0).contiguous()
    out = inp.new_empty((out_size, *inp.shape[1:]))
    return _run(collective, axis, name, nbytes(inp), max(nbytes(inp), nbytes(out)),
                lambda: out.movedim(0, dim), out, inp, async_op=async_op)


def all_to_all(t: torch.Tensor, axis: Axis, split_dim: int, concat_dim: int):
    """Cut `t` into n pieces along `split_dim`, send piece j to the rank at position j, and
    concatenate the n pieces received (rank order) along `concat_dim`. Each rank keeps 1/n
    of its tensor and sends the rest: (n-1)/n S on the wire (DeepSpeed-Ulysses' exchange).
    `split_dim` divisible by n (Ulysses' rule: heads divisible by `--cp`, or replicated)."""
    if axis.size == 1:
        return t
    inp = torch.stack(t.chunk(axis.size, dim=split_dim)).contiguous()   # [n, piece...]
    out = torch.empty_like(inp)
    return _run(dist.all_to_all_single, axis, "all_to_all", nbytes(inp), nbytes(inp),
                lambda: torch.cat(out.unbind(0), dim=concat_dim), out, inp)


def all_to_all_uneven(t: torch.Tensor, axis: Axis, send_rows: list[int], recv_rows: list[int]):
    """Send rows send_rows[j] of `t` (in order: the first send_rows[0] to position 0, ...) to
    the rank at position j, and return the rows received, recv_rows[j] from position j, in
    rank order: expert parallelism's dispatch and combine, whose sizes are the routing's.
    On the wire: every peer's share but this rank's own (chapter "Experts: the fifth axis"
    has the formula); the trace notes each share (`split_bytes`) for a replay to re-time."""
    row = t[0].numel() * t.element_size() if t.shape[0] else 0     # (no rows: all sizes 0)
    out = t.new_empty((sum(recv_rows), *t.shape[1:]))
    split = [n * row for n in send_rows]          # the bytes for each peer
    return _run(dist.all_to_all_single, axis, "all_to_all", nbytes(t), nbytes(t), lambda: out,
                out, t.contiguous(), recv_rows, send_rows, split_bytes=split,
                wire=sum(split) - split[axis.rank])


class Handle:
    """A collective in flight. `wait()` blocks until it has arrived and returns its result
    (the reduced tensor, the gathered one, the received buffers). Waiting twice is harmless:
    the works are dropped after the first wait (a second wait on a gloo receive would wait
    for another message)."""

    def __init__(self, works=(), result=None, finish=None):
        self.works, self._result, self._finish = list(works), result, finish

    def wait(self):
        with events.waiting(self.works):        # a trace sees how long this rank waited
            for w in self.works:
                w.wait()
        self.works = []
        return self._finish() if self._finish is not None else self._result


# ---------------------------------------------------------------------------- p2p
def exchange_async(sends=(), recvs=(), axis_name: str = "pp") -> Handle:
    """Post all sends and receives at once: [(tensor, global_peer_rank)], or [(tensor,
    global_peer_rank, tag)] where a pair of ranks exchanges several messages that must not
    be confused (a pipeline's activations and gradients). Returns at once: the `Handle`'s
    wait() returns the receive buffers (the caller keeps each sent tensor alive until then).

    Posting both directions in one batch is what makes a pipeline or a ring unable to
    deadlock: no rank blocks in a send while its peer blocks in another send.
    """
    start, me = events.now(), dist.get_rank()
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer, tag=tag[0] if tag else 0)
           for t, peer, *tag in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, tag=tag[0] if tag else 0) for t, peer, *tag in recvs]
    works = dist.batch_isend_irecv(ops) if ops else []
    # gloo gives one work per op; NCCL coalesces the batch into one
    for p, work in zip(ops, works if len(works) == len(ops) else works * len(ops)):
        op, size = "send" if p.op is dist.isend else "recv", nbytes(p.tensor)
        if LOG.record(axis_name, op, 2, size, wire := wire_bytes(op, 2, size)):
            # the trace pairs each send with its receive by (sender, receiver, tag)
            events.collective(axis_name, op, sorted((me, p.peer)), size, wire, start, work,
                              peer=p.peer, tag=p.tag)
    return Handle(works, result=[t for t, *_ in recvs])


def ring_exchange(axis: Axis, *tensors: torch.Tensor) -> Handle:
    """One step of a ring: send `tensors` to the next rank of `axis` and receive as many,
    shaped alike, from the previous one. Returns at once; the `Handle`'s wait() returns what
    arrived. Every ring in the book takes this step: the all-reduce written out (`ring.py`),
    ring attention (`parallel/context.py`) and collective matmul."""
    right, left = axis.global_rank(axis.rank + 1), axis.global_rank(axis.rank - 1)
    return exchange_async([(t, right) for t in tensors],
                          [(torch.empty_like(t), left) for t in tensors], axis.log_as)


@contextlib.contextmanager
def paused():
    """`with comm.paused():` collectives inside are not recorded (logging a metric, a
    test gathering gradients): the log holds only what the algorithm itself sends."""
    was, LOG.enabled = LOG.enabled, False
    try:
        yield
    finally:
        LOG.enabled = was
