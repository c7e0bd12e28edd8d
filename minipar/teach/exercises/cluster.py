"""The exercises of the cluster chapter, checked (see core.py for how): a layout for Table 4's
third row's setting, critiqued by the links its axes cross, the pods its replicas span, the
memory model and the planner (`critique`); a rank-to-coordinates mapping with a bug, the exposed time of a trace, and a
prediction of the bytes that leave a server, checked by a run."""
from __future__ import annotations

import functools

from ...plan import traces
from ...plan.config import ParallelConfig
from ...plan.config import TrainConfig
from ...plan.costmodel.constants import TABLE4_BATCH_TOKENS
from ...plan.costmodel.hardware import LLAMA3_CLUSTER, Cluster
from ...plan.costmodel.table4 import TABLE4
from ...trainer.grid import AXES, ProcessGrid
from ...trainer.step import Trainer
from ...runtime import topology as place
from ...runtime.run import train
from ...runtime.wire_meter import steps_by_axis
from .collectives import WIRE_WHY
from .core import Verdict, exercise, function_given, predicted, right, wrong
from .critique import Setting, critiqued


# Table 4's third row's setting: Llama 3 405B on 16,384 H100s (pods of 3,072), 128K tokens.
LONG = Setting(model="llama3-405b", gpus=TABLE4[2].gpus, seq_len=TABLE4[2].seq_len,
               batch_tokens=TABLE4_BATCH_TOKENS, points=3.0, pods=True)


@exercise("cluster", "design")
def check_axis_links(layout, reveal: bool = False) -> Verdict:
    """layout: a dict of tp, cp, pp, dp (the rest by default), zero, recompute, schedule,
    virtual_stages, microbatch_size for LONG, placed rank by rank on Llama 3's servers and
    pods. Right when TP's rings stay on NVLink, no model replica spans two pods, the
    fullest GPU fits in the HBM less the planner's headroom, and the predicted MFU is
    within LONG.points of the planner's best; the verdict lists the link each axis'
    rings cross, and what is wrong."""
    return critiqued(LONG, layout, reveal)


# ------------------------------------------------------------- a mapping with a bug
def broken_coords_of(rank: int, tp: int, cp: int, pp: int, dp: int) -> dict:
    """The notebook's broken version: peels DP off first, as if DP were innermost."""
    out = {}
    for axis, size in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
        out[axis] = rank % size
        rank //= size
    return out


LAYOUTS = [(2, 1, 2, 2), (8, 1, 2, 2), (2, 2, 2, 2), (4, 2, 1, 3), (1, 1, 4, 2)]


@exercise("cluster", "bug")
def check_coords_of(coords_of) -> Verdict:
    """coords_of(rank, tp, cp, pp, dp) -> {"tp", "cp", "pp", "dp"}: each rank's coordinates
    in the [TP, CP, PP, DP] order, checked against ProcessGrid on every rank of several
    layouts (uneven sizes among them)."""
    problem = function_given(coords_of)
    if problem is not None:
        return problem
    for tp, cp, pp, dp in LAYOUTS:
        grid = ProcessGrid(tp, cp, pp, dp)
        for r in range(grid.world_size):
            want = grid.coords(r)
            try:
                got = dict(coords_of(r, tp, cp, pp, dp))
            except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
                return wrong(f"coords_of({r}, {tp}, {cp}, {pp}, {dp}) raised {type(e).__name__}: {e}")
            if any(got.get(a) != want[a] for a in AXES):
                tp_group = [q for q in range(grid.world_size)
                            if _same_but(coords_of, q, r, "tp", (tp, cp, pp, dp))]
                return wrong(f"tp={tp} cp={cp} pp={pp} dp={dp}: rank {r} -> {got}, expected "
                             f"{want}. With your mapping rank {r}'s TP group is {tp_group}: "
                             f"on servers of {tp} GPUs, does it stay on one?")
    return right(f"every rank of {len(LAYOUTS)} layouts has ProcessGrid's coordinates: TP "
                 "innermost, so a TP group is consecutive GPUs, one server.")


def _same_but(coords_of, q, r, axis, sizes) -> bool:
    a, b = dict(coords_of(q, *sizes)), dict(coords_of(r, *sizes))
    return all(a.get(x) == b.get(x) for x in AXES if x != axis)


# ------------------------------------------------------------- exposed time from a trace
CASES = [   # (compute intervals, communication intervals) in microseconds
    ([(0, 10)], [(2, 4)]),                       # hidden entirely
    ([(0, 10)], [(8, 14)]),                      # half out: exposed 4
    ([(0, 5), (7, 12)], [(3, 9)]),               # a gap in the middle: exposed 2
    ([(0, 10)], [(12, 15), (13, 16)]),           # two lanes overlap: count the union once
    ([], [(0, 3), (1, 2)]),                      # nothing to hide behind
    ([(0, 4), (2, 8)], [(1, 9), (9, 11)]),       # overlapping compute spans too
]


def reference_exposed(compute, comm) -> float:
    """The time in `comm` not covered by `compute`: profile's union, subtract and length."""
    return traces.length(traces.subtract(traces.union(comm), traces.union(compute)))


@exercise("cluster", "implement")
def check_exposed(exposed) -> Verdict:
    """exposed(compute, comm) -> float: given a rank's compute intervals and one axis'
    communication intervals [(start, end), ...], the communication time during which the
    rank computed nothing (what `traces.hidden_and_exposed` calls exposed)."""
    problem = function_given(exposed)
    if problem is not None:
        return problem
    for compute, comm in CASES:
        want = reference_exposed(compute, comm)
        try:
            got = float(exposed(list(compute), list(comm)))
        except Exception as e:   # noqa: BLE001
            return wrong(f"exposed({compute}, {comm}) raised {type(e).__name__}: {e}")
        if abs(got - want) > 1e-9:
            return wrong(f"exposed({compute}, {comm}) = {got:g}, expected {want:g}. Do "
                         f"overlapping spans count once? Does a gap in the compute expose?")
    return right(f"{len(CASES)} traces, overlapping lanes and gaps included.")


# ------------------------------------------------------------- bytes that leave a server
@functools.cache
def _rank0_wire(tp: int, dp: int) -> dict:
    """{axis: bytes} rank 0 wrote to its sockets in one step of `tiny` on gloo, each
    collective measured on its own and filed under its axis (`wire.steps_by_axis`)."""
    with steps_by_axis(Trainer):
        out = train(TrainConfig(parallel=ParallelConfig(tp=tp, dp=dp), steps=1, progress=False))
    return out["records"][-1]["wire"]


def leaving_bytes(tp: int, dp: int, gpus_per_node: int) -> tuple[int, list[str]]:
    """The bytes rank 0 wrote in one step of `tiny` on every axis whose group leaves its
    server (servers of `gpus_per_node`), and those axes. A rank's sends on an axis go to
    peers of its group, so an axis's bytes leave the server when a peer is outside it: a
    ring's next rank (all-reduce), or each peer in turn (gloo's all-gather of n = 2)."""
    measured = _rank0_wire(tp, dp)
    grid = ProcessGrid(tp=tp, dp=dp)
    cluster = Cluster(gpus_per_node=gpus_per_node, pod_size=LLAMA3_CLUSTER.pod_size)
    leaving = sorted(a for a in ("tp", "dp", "world")
                     if any(place.link(0, r, cluster) != "NVLink" for r in grid.axes[a].ranks))
    return sum(measured.get(axis, 0) for axis in leaving), leaving


@exercise("cluster", "predict")
def check_bytes_leaving_server(prediction, tp: int = 2, dp: int = 2, gpus_per_node: int = 2,
                               measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the wire bytes rank 0 sends per step over links that leave its server, for
    `tiny` under --tp tp --dp dp on servers of `gpus_per_node`, on gloo; then run one step
    and add what rank 0 wrote to its sockets on every axis whose group leaves its server."""
    run = (lambda: leaving_bytes(tp, dp, gpus_per_node)[0]) if measured is None else measured
    return predicted(prediction, run, "the bytes leaving the server", 0.01,
                     WIRE_WHY, unit="B",
                     reveal=reveal, details=lambda: " Axes that left the server: "
                                                    f"{leaving_bytes(tp, dp, gpus_per_node)[1]}.")


__all__ = [n for n in dir() if n.startswith("check_")]
