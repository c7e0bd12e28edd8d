"""Bytes on the wire, measured: each rank's own write counter around a real collective.

Chapter "Collectives".

`CommLog` measures which collectives run and their sizes; the wire bytes it files are the
ring formula applied to those sizes, so they cannot disagree with the formula. This file
asks the kernel instead. gloo sends over TCP sockets with write() and writev(), and Linux
counts every byte a process writes in `wchar` (/proc/self/io), whichever thread wrote it.
Read before and after one collective, the difference is what this rank sent: the payload's
bytes plus gloo's own headers (up to 2 KB per collective), plus anything else the process
wrote meanwhile (nothing, here); `by_axis` does so for every collective of a training
step and files each under its axis. The tolerance is therefore one-sided and small:

    gloo's rule  <=  measured  <=  gloo's rule + HEADER_BYTES per collective

`rchar` is no use for the other direction: it does not see gloo's receives. The loopback
interface's counters (/proc/net/dev, `lo`) see every rank of the machine at once, and any
other process, so the per-rank counter is the cleaner instrument.

What gloo does is not always the ring (`GLOO_WIRE`): torch's gloo backend has no
reduce-scatter of its own; it all-reduces the whole input and keeps its 1/n, so a
reduce-scatter costs what an all-reduce does, twice the ring's. NCCL runs the ring.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from ..plan.formulas.collectives import wire_bytes
from ..trainer import comm
from ..trainer.comm import Axis, all_gather, all_reduce, all_to_all, reduce_scatter, ring_exchange

WIRE_GRID = dict(tp=2, cp=2, pp=2, dp=2)    # the chapter's 2x2x2x2 grid: 16 ranks
HEADER_BYTES = 8_000          # gloo's headers per collective: measured under 2 KB, bound loosely

# op -> (how torch's gloo backend runs it, the bytes one rank sends over n ranks, S bytes)
# (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp and gloo/allreduce.cc, allgather.cc,
# alltoall.cc). S as `wire_bytes` takes it: the gathered result, the full input.
GLOO_WIRE = {
    "all_reduce": ("ring: a reduce-scatter pass, then an all-gather pass",
                   lambda n, s: 2 * (n - 1) * s // n),
    "all_gather": ("ring: each rank forwards the n-1 blocks it does not own",
                   lambda n, s: (n - 1) * s // n),
    "reduce_scatter": ("an all-reduce of the whole input; each rank keeps its 1/n",
                       lambda n, s: 2 * (n - 1) * s // n),
    "all_to_all": ("pairwise: each peer gets its piece directly; one stays home",
                   lambda n, s: (n - 1) * s // n),
    "send": ("one message to one peer", lambda n, s: s),
    "recv": ("the receiver writes nothing", lambda n, s: 0),
}

# the collectives minipar runs on each axis (the chapters that run them)
AXIS_OPS = {
    "tp": ("all_reduce", "all_gather", "reduce_scatter"),   # Megatron's f/g; sequence parallel
    "cp": ("send", "all_to_all"),                           # ring attention; Ulysses
    "pp": ("send",),                                        # activations to the next stage
    "dp": ("all_reduce", "reduce_scatter", "all_gather"),   # DDP's buckets; ZeRO
    "dp_cp": ("all_reduce", "reduce_scatter", "all_gather"),  # gradients over dp x cp
}


def gloo_bytes(op: str, n: int, size: int) -> int:
    """Bytes one rank sends for `op` over n ranks under gloo's algorithm (`GLOO_WIRE`)."""
    return 0 if n <= 1 else GLOO_WIRE[op][1](n, size)


def sent_bytes() -> int:
    """Bytes this process has written so far: every socket write of every thread."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def measure(collective) -> int:
    """Bytes this rank writes while `collective()` runs (gloo returns only once its sends
    have left this process, so nothing of it is written later)."""
    before = sent_bytes()
    collective()
    return sent_bytes() - before


def _run_op(op: str, axis: Axis, size: int):
    """The call minipar makes for `op`, on a float32 tensor whose S (as `wire_bytes` takes
    it) is `size` bytes. Sends go round the axis as a ring: the next rank, from the previous
    (the pipeline's pairs, at n = 2, are the same)."""
    x = torch.ones(size // 4)
    if op == "all_reduce":
        return lambda: all_reduce(x, axis)
    if op == "all_gather":                  # each rank holds 1/n; S is what is gathered
        return lambda: all_gather(x[: x.numel() // axis.size], axis)
    if op == "reduce_scatter":
        return lambda: reduce_scatter(x, axis)
    if op == "all_to_all":
        return lambda: all_to_all(x.view(axis.size, -1), axis, split_dim=0, concat_dim=0)
    return lambda: ring_exchange(axis, x).wait()


def measure_axes(axes: dict[str, Axis], size: int = 2**20) -> list[dict]:
    """On every rank: each op of `AXIS_OPS` on its axis, measured. One row per (axis, op):
    this rank's measured bytes next to the ring formula's and gloo's rule. Collective: every
    rank calls it with the same axes, in the same order."""
    rows = []
    for name, ops in AXIS_OPS.items():
        axis = axes[name]
        for op in ops:
            call = _run_op(op, axis, size)
            dist.barrier()                   # everyone lined up: no rank mid-collective
            got = measure(call)
            rows.append(dict(axis=name, op=op, n=axis.size, payload=size, measured=got,
                             ring=wire_bytes(op, axis.size, size),
                             gloo=gloo_bytes(op, axis.size, size)))
    return rows


# ------------------------------------------------------------------ a run's wire, by axis
# The write counter is per process, and a run of several axes has collectives of several
# groups in flight at once: one reading around a step cannot say which axis sent what. Linux
# also counts per thread (/proc/self/task/<tid>/io), but the threads do not split a run by
# axis: a group's collectives run on its two `pt_gloo_runloop` workers, yet a write the
# socket cannot take at once is finished by a `gloo_tcp_loop` thread that several groups
# share, and every send and receive (ring attention's exchange, the pipeline's activations)
# is posted on the default group from the calling thread, whatever its axis
# (`comm.exchange_async`). In a tp x cp x dp step the tp all-reduces' bytes land on four
# threads, two of them shared.
# What can: minipar's every collective goes through `comm._run` and `comm.exchange_async`,
# which know the axis. `by_axis` wraps those two, waits for each call at once and files the
# process's write-counter difference under the call's axis. Waiting at once removes overlap,
# which moves time, not bytes. A receive posted on its own (a pipeline posts them ahead) is
# left in flight: it writes only gloo's short notice to its sender, within the headers.

def _file(tally: dict, axis: str, op: str, measured: int, rule: int):
    """Add one call to tally[axis][op]: calls, bytes measured, gloo's rule (`GLOO_WIRE`)."""
    st = tally.setdefault(axis, {}).setdefault(op, dict(calls=0, measured=0, gloo=0))
    st["calls"], st["measured"], st["gloo"] = st["calls"] + 1, st["measured"] + measured, st["gloo"] + rule


def _measured_run(real, tally: dict):
    """`comm._run`, each collective waited on and its bytes filed under its axis. gloo's
    rule for an uneven all-to-all is what its caller says leaves the rank (`wire`): each
    peer gets its rows directly."""
    def run(collective, axis, name, payload, full, finish, /, *args, async_op=False, **kw):
        before = sent_bytes()
        out = real(collective, axis, name, payload, full, finish, *args, async_op=async_op, **kw)
        out = comm.Handle(result=out.wait()) if async_op else out
        rule = gloo_bytes(name, axis.size, full) if kw.get("wire") is None else kw["wire"]
        _file(tally, axis.log_as, name, sent_bytes() - before, rule)
        return out
    return run


def _measured_exchange(real, tally: dict):
    """`comm.exchange_async`, a batch that sends waited on at once, filed under its axis."""
    def exchange_async(sends=(), recvs=(), axis_name: str = "pp"):
        before = sent_bytes()
        handle = real(sends, recvs, axis_name)
        handle = comm.Handle(result=handle.wait()) if sends else handle
        _file(tally, axis_name, "send" if sends else "recv", sent_bytes() - before,
              sum(comm.nbytes(t) for t, *_ in sends))
        return handle
    return exchange_async


@contextlib.contextmanager
def by_axis():
    """`with wire.by_axis() as tally:` every collective minipar runs inside is measured on
    its own; tally[axis][op] = {calls, measured, gloo}: the bytes this rank wrote, and
    gloo's rule for the same calls."""
    tally: dict = {}
    real = comm._run, comm.exchange_async
    comm._run, comm.exchange_async = _measured_run(real[0], tally), _measured_exchange(real[1], tally)
    try:
        yield tally
    finally:
        comm._run, comm.exchange_async = real


def axis_bytes(tally: dict) -> dict[str, int]:
    """{axis: the bytes measured on it}, from a `by_axis` tally."""
    return {axis: sum(st["measured"] for st in ops.values()) for axis, ops in tally.items()}


@contextlib.contextmanager
def steps_by_axis(trainer_cls):
    """While inside, each `trainer_cls.step` (minipar's Trainer, passed in: the trainer does
    not know this file) runs under `by_axis`, and its record carries "wire": {axis: bytes}
    and "wire_ops": the tally. Forked ranks inherit the wrapped step."""
    real = trainer_cls.step

    def step(self, n: int) -> dict:
        with by_axis() as tally:
            rec = real(self, n)
        return {**rec, "wire": axis_bytes(tally), "wire_ops": tally}
    trainer_cls.step = step
    try:
        yield
    finally:
        trainer_cls.step = real
