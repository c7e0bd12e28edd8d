"""The exercises of the llama3 chapter (book/llama3.md), checked (see core.py for how).

- `check_param_count` (bug): `buggy_param_count` fixed, checked against the tensors of
  the real model (`model.Transformer`, built on the meta device);
- `check_rank_coords` (implement): a rank's (tp, cp, pp, dp) coordinates in the order
  [TP, CP, PP, DP], against `ProcessGrid`;
- `check_published_layout` (design): a layout for Table 4's first row's setting, critiqued
  by the memory model, the placement and the planner (`critique`);
- `check_straddling_replicas` (bug): `buggy_straddling_replicas` fixed, checked against
  the replicas `ProcessGrid` places in two pods;
- `check_predict_stage_params` (predict): the parameter bytes of the fullest GPU of a TP2
  PP2 run, predicted, then measured by running minipar.
"""
from __future__ import annotations

import torch

from ...plan.config import ModelConfig, ParallelConfig, TrainConfig
from ...plan.costmodel.constants import TABLE4_BATCH_TOKENS
from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.costmodel.table4 import TABLE4
from ...plan.flops import local_param_count
from ...trainer.grid import ProcessGrid
from ...trainer.model import Transformer
from ...runtime.run import train
from .core import Verdict, compare_calls, exercise, function_given, predicted, right, wrong, yours
from .critique import Setting, critiqued

# Shapes that catch the usual slips: GQA (K and V narrower than Q), tied embeddings (one
# table, counted once), a square FFN, Llama 3 405B itself.
PARAM_CASES = [(ModelConfig(),), (ModelConfig(tie_embeddings=True),),
               (ModelConfig(n_layers=3, dim=64, n_heads=8, n_kv_heads=2, ffn_dim=64, vocab_size=100),),
               (ModelConfig.preset("llama3-405b"),)]


def model_params(model: ModelConfig) -> int:
    """The parameters the real model holds: `Transformer(model)` built on the meta device
    (shapes without storage, so even 405B costs nothing), each tied table counted once."""
    with torch.device("meta"):
        built = Transformer(model, seed=None)
    return sum(p.numel() for p in built.parameters())    # parameters() yields a tied one once


def buggy_param_count(model: ModelConfig) -> int:
    """The parameters of a Llama from its fields, with two bugs (the exercise)."""
    h, layers = model.dim, model.n_layers
    attention = 4 * h * h                              # q, k, v, o
    mlp = 3 * h * model.ffn_dim                        # gate, up, down
    return layers * (attention + mlp) + 2 * model.vocab_size * h + h


@exercise("llama3", "bug")
def check_param_count(fn) -> Verdict:
    """fn(model: ModelConfig) -> int: `buggy_param_count` fixed, compared with the
    parameters the real `Transformer(model)` holds (built on the meta device), for four
    shapes: GQA, tied embeddings, a small odd one and Llama 3 405B."""
    return compare_calls(
        fn, PARAM_CASES, model_params, 0.0,
        lambda args, got, want: _param_hint(args[0], got, want),
        "every parameter of the real model, for four shapes (GQA, tied embeddings, Llama 3 405B).",
        call=lambda args: f"{yours(fn)}({_name(args[0])})")


def _name(m: ModelConfig) -> str:
    if m.name != "custom":
        return m.name
    return f"ModelConfig(n_layers={m.n_layers}, dim={m.dim}, n_kv_heads={m.n_kv_heads}, tied={m.tie_embeddings})"


def _param_hint(m: ModelConfig, got: float, want: float) -> str:
    h, kv = m.dim, m.n_kv_heads * m.head_dim
    diff = got - want
    name = _name(m)
    known = {2 * m.n_layers * h * (h - kv): "K and V have n_kv_heads x head_dim outputs, not dim (GQA).",
             m.vocab_size * h: "with tie_embeddings the embedding and the head are one table.",
             -m.vocab_size * h: "the output head is its own table unless tie_embeddings.",
             -(2 * m.n_layers + 1) * h: "the RMSNorm weights count too (two per layer, one final).",
             -2 * m.n_layers * h: "each layer has two RMSNorm weights."}
    for delta, why in known.items():
        if delta and diff == delta:
            return f"{name}: you count {got:,.0f}, off by {diff:+,.0f}: {why}"
    return f"{name}: you count {got:,.0f}, off by {diff:+,.0f} parameters."


LAYOUTS = [ParallelConfig(tp=2, cp=2, pp=2, dp=2), ParallelConfig(tp=4, cp=1, pp=2, dp=3),
           ParallelConfig(tp=1, cp=3, pp=2, dp=2), ParallelConfig(tp=2, cp=1, pp=1, dp=4)]


@exercise("llama3", "implement")
def check_rank_coords(fn) -> Verdict:
    """fn(rank, tp, cp, pp, dp) -> (tp_index, cp_index, pp_index, dp_index): the rank's
    coordinates in the order [TP, CP, PP, DP], innermost first (rank = tp + T (cp + C (pp
    + P dp))). Checked for every rank of four layouts against `grid.ProcessGrid`."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for pc in LAYOUTS:
        degrees = (pc.tp, pc.cp, pc.pp, pc.dp)
        for rank in range(pc.world_size):
            c = ProcessGrid(*degrees).coords(rank)
            want = (c["tp"], c["cp"], c["pp"], c["dp"])
            try:
                got = tuple(int(x) for x in fn(rank, *degrees))
            except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
                return wrong(f"{yours(fn)}({rank}, {', '.join(map(str, degrees))}) raised "
                             f"{type(e).__name__}: {e}")
            if got != want:
                return wrong(f"TP{pc.tp} CP{pc.cp} PP{pc.pp} DP{pc.dp}, rank {rank}: you give {got}, "
                             f"the grid says {want}" + (" (is TP innermost?)" if got[::-1] == want else "."))
    return right("every rank of four layouts, uneven degrees included.")


# Table 4's first row's setting: Llama 3 405B on 8,192 H100s, 8K tokens, 16M-token batches.
PUBLISHED = Setting(model="llama3-405b", gpus=TABLE4[0].gpus, seq_len=TABLE4[0].seq_len,
                    batch_tokens=TABLE4_BATCH_TOKENS, points=3.0)


@exercise("llama3", "design")
def check_published_layout(layout, reveal: bool = False) -> Verdict:
    """layout: a dict of tp, cp, pp, dp (the rest by default), zero, recompute, schedule,
    virtual_stages, microbatch_size for PUBLISHED. Right when the fullest GPU fits in the
    HBM less the planner's headroom, TP's rings stay on NVLink, and the predicted MFU is
    within PUBLISHED.points of the planner's best; otherwise the verdict says which part
    overflows, which axis leaves the server, and what the layout loses most to. The
    planner's best layout shows from your second layout on, or with reveal=True."""
    return critiqued(PUBLISHED, layout, reveal)


def buggy_straddling_replicas(model_gpus: int, world: int, pod_size: int) -> list[int]:
    """The model replicas (DP indices) whose consecutive GPUs span two pods, with a bug
    (the exercise)."""
    return [d for d in range(world // model_gpus)
            if d * model_gpus // pod_size != (d + 1) * model_gpus // pod_size]


# (tp, cp, pp, dp, pod size): Table 4's row 3 on Llama 3's pods, replicas that end exactly
# at a pod's edge, and replicas larger than a pod
STRADDLE_CASES = [(8, 16, 16, 8, LLAMA3_CLUSTER.pod_size), (2, 1, 2, 8, 8), (2, 2, 2, 6, 12),
                  (4, 1, 4, 4, 8)]


def replicas_across_pods(tp: int, cp: int, pp: int, dp: int, pod_size: int) -> list[int]:
    """The DP indices whose replica's ranks, as `ProcessGrid` lays them on consecutive
    GPUs, sit in more than one pod: counted from the grid, rank by rank."""
    grid = ProcessGrid(tp, cp, pp, dp)
    pods: dict[int, set] = {}
    for rank in range(grid.world_size):
        pods.setdefault(grid.coords(rank)["dp"], set()).add(rank // pod_size)
    return sorted(d for d, held in pods.items() if len(held) > 1)


@exercise("llama3", "bug")
def check_straddling_replicas(fn) -> Verdict:
    """fn(model_gpus, world, pod_size) -> [DP indices]: `buggy_straddling_replicas` fixed,
    compared with the replicas whose ranks `ProcessGrid` places in two pods, for Table 4's
    row 3 on Llama 3's pods and smaller grids (a replica ending at a pod's edge among them)."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for tp, cp, pp, dp, pod in STRADDLE_CASES:
        size = tp * cp * pp
        want = replicas_across_pods(tp, cp, pp, dp, pod)
        call = f"{yours(fn)}({size:,}, {size * dp:,}, {pod:,})"
        try:
            got = sorted(int(x) for x in fn(size, size * dp, pod))
        except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
            return wrong(f"{call} raised {type(e).__name__}: {e}")
        if got != want:
            extra = sorted(set(got) - set(want))
            return wrong(f"{call} returned {got}: " + (
                f"replica(s) {extra} sit in one pod (their last GPU is "
                f"{[(d + 1) * size - 1 for d in extra]}); which GPU does a replica end on?"
                if extra else f"{len(set(want) - set(got))} replica(s) that span two pods are missing."))
    return right(f"every replica the grid places in two pods, for {len(STRADDLE_CASES)} grids "
                 "(Table 4's row 3 among them).")


STAGE_RUN = dict(tp=2, pp=2, global_batch=4, seq_len=32)


def stage_run_params() -> int:
    """Run `python -m minipar.train --tp 2 --pp 2` on the tiny model (fp32, one step) and
    return the parameter bytes of the fullest rank, as the step record's `memory` says."""
    pc = ParallelConfig(tp=STAGE_RUN["tp"], pp=STAGE_RUN["pp"])
    run = train(TrainConfig(parallel=pc, global_batch=STAGE_RUN["global_batch"],
                            seq_len=STAGE_RUN["seq_len"], steps=1, progress=False))
    return run["records"][-1]["memory"]["params"]


def stage_model_params() -> int:
    """The same from the formulas: every stage's parameters on one TP rank, fp32, the largest."""
    m, tp, pp = ModelConfig.preset("tiny"), STAGE_RUN["tp"], STAGE_RUN["pp"]
    return max(4 * local_param_count(m, tp, m.n_layers // pp, s == 0, s == pp - 1) for s in range(pp))


@exercise("llama3", "predict")
def check_predict_stage_params(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes of parameters (fp32) held by the fullest GPU of
    `python -m minipar.train --tp 2 --pp 2` on the tiny model; the check then runs it (or
    takes `measured`, the `memory["params"]` of a run you made) and reports run / prediction.
    Parameters are counted exactly, so exact is right."""
    return predicted(prediction, stage_run_params if measured is None else measured,
                     "the parameter bytes of the fullest GPU", 1e-9,
                     "minipar counts the tensors each rank holds exactly", unit="B", reveal=reveal)


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_param_count",
                                                          "buggy_straddling_replicas"]
