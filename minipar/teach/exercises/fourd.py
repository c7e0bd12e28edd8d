"""The exercises of the four dimensions at once chapter, checked (see core.py for how).

Four checks: a DP group (implement), a coordinate function
with the axes peeled in the wrong order (bug), rank 0's DP bytes of a TP2 x DP2 run,
predicted and then measured on four gloo ranks (predict), and a layout planned by hand,
then critiqued by the planner: how far from its best, and what the layout loses most to
(design).
"""
from __future__ import annotations

from functools import cache

from ...plan.config import ConfigError, ModelConfig, ParallelConfig
from ...plan.config import TrainConfig
from ...plan.costmodel import estimate, gpu_cluster, limiting_term, plan
from ...plan.costmodel.planner import MIN_TOKENS_PER_CP_RANK, describe, memory_budget_gb
from ...plan.flops import local_param_count
from ...plan.flops import param_count
from ...trainer.grid import AXES, ProcessGrid
from ...trainer.step import Trainer
from ...runtime.run import train
from ...runtime.wire_meter import steps_by_axis
from .collectives import HEADERS_WHY
from .core import (NOT_ANSWERED, Verdict, exercise, function_given, predicted, reveals, right,
                   wrong, yours)
from ..numbers.fourd import PLAN_EXERCISE


@exercise("fourd", "implement")
def check_dp_group(fn) -> Verdict:
    """fn(rank, tp, cp, pp, dp) -> the global ranks of `rank`'s DP group, sorted."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for sizes in [(2, 1, 1, 2), (2, 2, 2, 2), (8, 1, 4, 3)]:
        grid = ProcessGrid(*sizes)
        for rank in range(0, grid.world_size, 5):
            want = list(grid.group_ranks("dp", rank))
            try:
                got = sorted(int(r) for r in fn(rank, *sizes))
            except Exception as e:   # noqa: BLE001
                return wrong(f"{yours(fn)}({rank}, {', '.join(map(str, sizes))}) raised "
                              f"{type(e).__name__}: {e}")
            if got != want:
                return wrong(f"{yours(fn)}({rank}, {', '.join(map(str, sizes))}) returned {got}: a DP group "
                              f"holds {sizes[3]} ranks that differ only in their dp coordinate.")
    return right("your DP groups match ProcessGrid's.")


def buggy_coords(rank: int, tp: int, cp: int, pp: int, dp: int) -> dict[str, int]:
    """The broken variant of `check_coords_bug`: it peels the axes off the rank
    outermost-first, as if DP varied fastest."""
    out = {}
    for axis, size in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
        out[axis], rank = rank % size, rank // size
    return out


@exercise("fourd", "bug")
def check_coords_bug(fn) -> Verdict:
    """fn(rank, tp, cp, pp, dp) -> {"tp", "cp", "pp", "dp"}: `buggy_coords` fixed. Checked
    on every rank of grids whose sizes differ per axis (a swapped pair of axes of equal
    size would pass on a 2 x 2 x 2 x 2 grid), against `ProcessGrid.coords`."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for sizes in [(2, 3, 1, 4), (4, 1, 3, 2), (8, 2, 2, 3)]:
        grid = ProcessGrid(*sizes)
        for rank in range(grid.world_size):
            want = grid.coords(rank)
            try:
                got = {a: int(fn(rank, *sizes)[a]) for a in AXES}
            except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
                return wrong(f"{yours(fn)}({rank}, {', '.join(map(str, sizes))}) raised "
                             f"{type(e).__name__}: {e}")
            if got != want:
                off = [a for a in AXES if got[a] != want[a]]
                return wrong(f"rank {rank} of tp,cp,pp,dp = {sizes}: got {got}, the {', '.join(off)} "
                             f"coordinate is off. Which axis varies fastest as the rank grows?")
    return right("every rank of three uneven grids has ProcessGrid's coordinates.")




def measured_dp_bytes(tp: int = 2, dp: int = 2, steps: int = 1) -> int:
    """The bytes rank 0 wrote to its sockets for the dp axis in the last of `steps` steps of
    `tiny` on tp x dp gloo ranks (`wire.steps_by_axis`: each collective measured on its own,
    filed under its axis). Plain DP: one all-reduce of the gradients the rank holds."""
    with steps_by_axis(Trainer):
        records = train(TrainConfig(parallel=ParallelConfig(tp=tp, dp=dp), steps=steps,
                                    progress=False))["records"]
    return records[-1]["wire"]["dp"]


@exercise("fourd", "predict")
def check_predict_dp_shard_bytes(prediction, tp: int = 2, dp: int = 2, measured: int | None = None,
                                 reveal: bool = False) -> Verdict:
    """Predict the bytes rank 0 puts on the wire for DP in one step of `tiny` (float32)
    with TP`tp` x DP`dp`, no ZeRO: then minipar runs it on tp*dp gloo ranks, measures what
    rank 0 wrote to its sockets for the dp axis alone (`wire`), and reports measured /
    predicted."""
    model = ModelConfig.preset("tiny")
    local = local_param_count(model, tp, model.n_layers, True, True)
    ring = 2 * (dp - 1) / dp
    hints = [(ring * 4 * param_count(model), "that is the whole model: rank 0 only holds (and "
                                             "reduces) its TP shard of each matrix."),
             (4 * local, "that is the gradient's size; a ring all-reduce puts 2(n-1)/n of it "
                         "on the wire."),
             (ring * 2 * local, "minipar's CPU run is float32: 4 bytes per element.")]
    return predicted(prediction, (lambda: measured_dp_bytes(tp, dp)) if measured is None else measured,
                     "rank 0's DP wire bytes", 0.01, HEADERS_WHY, unit="B",
                     reveal=reveal, hints=[h for h in hints if h[0] != ring * 4 * local])


@exercise("fourd", "design")
def check_plan(layout, model: str = PLAN_EXERCISE["model"], gpu: str = PLAN_EXERCISE["gpu"],
               gpus: int = PLAN_EXERCISE["gpus"], seq_len: int = PLAN_EXERCISE["seq_len"],
               batch_tokens: int = PLAN_EXERCISE["batch_tokens"],
               points: float = PLAN_EXERCISE["points"], reveal: bool = False) -> Verdict:
    """layout: {"tp", "cp", "pp"} planned by hand with the chapter's rules (DP takes the
    rest). The planner completes it as it completes its own (schedule and chunks,
    micro-batch, the lowest ZeRO stage and least recomputation that fit in the HBM less
    the headroom); right when it fits and its predicted MFU is within `points` of the
    planner's best. The planner's own layout shows when yours is right, from your second
    layout on, or with reveal=True."""
    ranked = _planned(model, gpu, gpus, seq_len, batch_tokens)
    if layout is None:
        return Verdict(None, f"The planner's best: {describe(ranked[0])}, {100 * ranked[0].mfu:.1f}% "
                             f"MFU." if reveal and ranked else NOT_ANSWERED)
    try:
        tp, cp, pp = (int(layout[k]) for k in ("tp", "cp", "pp"))
    except (TypeError, KeyError, ValueError) as e:
        return wrong(f"answer with a dict with keys 'tp', 'cp', 'pp' ({e}).")
    mine = next((e for e in ranked if (e.parallel.tp, e.parallel.cp, e.parallel.pp) == (tp, cp, pp)), None)
    if mine is None:
        return wrong(_why_not_planned(ModelConfig.preset(model), gpu_cluster(gpu), gpus, tp, cp, pp,
                                      seq_len, batch_tokens))
    best = ranked[0]
    if 100 * (best.mfu - mine.mfu) <= points:
        return right(f"yours {describe(mine)}: {100 * mine.mfu:.1f}% vs the planner's "
                     f"{describe(best)}: {100 * best.mfu:.1f}% (ratio {mine.mfu / best.mfu:.2f}).")
    theirs = (f"the planner's {describe(best)}: {100 * best.mfu:.1f}%"
              if reveals("the planned layout", (tp, cp, pp), reveal) else "the planner's best")
    _, _, term, share, _ = limiting_term(mine)
    return wrong(f"yours {describe(mine)}: {100 * mine.mfu:.1f}% MFU, more than {points:g} points "
                 f"short of {theirs}. Yours loses most to {term}, {share:.0%} of the step: "
                 f"what would shrink it?")


@cache
def _planned(model: str, gpu: str, gpus: int, seq_len: int, batch_tokens: int) -> list:
    return plan(ModelConfig.preset(model), gpu_cluster(gpu), gpus, seq_len, batch_tokens, top=None).ranked


def _why_not_planned(m, cluster, gpus, tp, cp, pp, seq_len, batch_tokens) -> str:
    """A layout the planner did not keep: it cannot run, or it does not fit."""
    if tp * cp * pp <= 0 or gpus % (tp * cp * pp):
        return f"TP x CP x PP = {tp * cp * pp} does not divide {gpus} GPUs."
    pc = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=gpus // (tp * cp * pp), sp=tp > 1, zero=3,
                        cp_impl="allgather")
    try:
        e = estimate(m, pc, cluster, seq_len, global_batch_tokens=batch_tokens, recompute="full")
    except ConfigError as err:
        return f"that layout cannot run: {err}"
    if e.memory_gb_per_gpu <= memory_budget_gb(cluster):
        return (f"TP{tp} CP{cp} PP{pp} is outside the planner's space: TP within one server, CP "
                f"only while each rank keeps >= {MIN_TOKENS_PER_CP_RANK:,} tokens, powers of two.")
    return (f"TP{tp} CP{cp} PP{pp} does not fit in {memory_budget_gb(cluster):.0f} GB (the HBM "
            f"less the planner's headroom) even with ZeRO-3 and full recomputation "
            f"({e.memory_gb_per_gpu:.0f} GB): rule 1 comes first.")


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_coords", "measured_dp_bytes"]
