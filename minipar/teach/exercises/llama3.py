"""The exercises of the llama3 chapter (book/llama3.md), checked (see core.py for how).

- `check_param_count` (implement): count a Llama's parameters from its shape, checked
  against the tensors of the real model (`model.Transformer`, built on the meta device);
- `check_rank_coords` (implement): a rank's (tp, cp, pp, dp) coordinates in the order
  [TP, CP, PP, DP], against `ProcessGrid`;
- `check_model_state_gb` (number): the model state per GPU of Table 4's row 1, from the
  precision the paper states (fp32 gradients), not from a bytes-per-parameter given;
- `check_straddling_replicas` (number): which of row 3's model replicas span two pods;
- `check_predict_stage_params` (predict): the parameter bytes of the fullest GPU of a TP2
  PP2 run, predicted, then measured by running minipar.
"""
from __future__ import annotations

import torch

from ...plan.config import ModelConfig, ParallelConfig, TrainConfig
from ...plan.costmodel.hardware import LLAMA3_CLUSTER
from ...plan.costmodel.table4 import TABLE4
from ...plan.flops import local_param_count
from ...plan.flops import param_count
from ...plan.memory import BF16_MIXED
from ...trainer.grid import ProcessGrid
from ...trainer.model import Transformer
from ...runtime.run import train
from ...runtime.topology import straddling_replicas
from .core import (Verdict, compare_calls, exercise, function_given, number, predicted, right,
                   wrong)

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


@exercise("llama3", "implement")
def check_param_count(fn) -> Verdict:
    """fn(model: ModelConfig) -> int, every parameter of the Llama `model` from its fields,
    compared with the parameters the real `Transformer(model)` holds, for four shapes."""
    return compare_calls(
        fn, PARAM_CASES, model_params, 0.0,
        lambda args, got, want: _param_hint(args[0], got, want),
        "every parameter, for four shapes (GQA, tied embeddings, Llama 3 405B).",
        call=lambda args: f"fn({_name(args[0])})")


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
                return wrong(f"fn({rank}, {', '.join(map(str, degrees))}) raised {type(e).__name__}: {e}")
            if got != want:
                return wrong(f"TP{pc.tp} CP{pc.cp} PP{pc.pp} DP{pc.dp}, rank {rank}: you give {got}, "
                             f"the grid says {want}" + (" (is TP innermost?)" if got[::-1] == want else "."))
    return right("every rank of four layouts, uneven degrees included.")


@exercise("llama3", "number")
def check_model_state_gb(answer, zero1: bool = False) -> Verdict:
    """GB (1e9 bytes) of model state per GPU in Table 4 row 1 (TP8 PP16 DP64), the 405B's
    parameters split evenly over TP x PP, under the precision the paper states (bf16
    weights, gradients accumulated and reduce-scattered in fp32, Adam with fp32 master
    weights: `costmodel.constants.BF16_MIXED`); with zero1=True the optimizer state (master
    weights and moments) is also sharded over DP."""
    row, p = TABLE4[0], BF16_MIXED
    n = param_count(ModelConfig.preset("llama3-405b"))
    split = row.tp * row.pp
    held = p.param_bytes + p.grad_bytes                   # not sharded by ZeRO-1
    per_param = held + p.optimizer_bytes / (row.dp if zero1 else 1)
    want = n * per_param / split / 1e9
    full = held + p.optimizer_bytes
    bf16_grads = p.param_bytes + 2 + p.optimizer_bytes / (row.dp if zero1 else 1)
    what = "the model state per GPU" + (" with ZeRO-1" if zero1 else "")
    return number(answer, want, what, rel=5e-3, unit="GB", hints=[
        (n * bf16_grads / split / 1e9, "that counts bf16 gradients; the paper says Llama 3 "
                                       "accumulates and reduce-scatters them in fp32."),
        (n * full / row.gpus / 1e9, "DP replicates the model: divide by TP x PP, not by every GPU."),
        (n * full / row.tp / 1e9, "PP splits the layers too: divide by TP x PP."),
        (n * per_param / split / 2**30, "GB here are 1e9 bytes, not GiB."),
        (n * held / split / 1e9, "that is the weights and gradients only; Adam keeps more."),
    ])


@exercise("llama3", "number")
def check_straddling_replicas(answer) -> Verdict:
    """The DP indices (a list) of Table 4 row 3's model replicas (TP8 CP16 PP16: 2,048
    consecutive GPUs each, 8 of them) whose GPUs span two 3,072-GPU pods."""
    if answer is None:
        return Verdict(None, "Not answered yet: replace None with your list and run the cell again.")
    row, pod = TABLE4[2], LLAMA3_CLUSTER.pod_size
    want = straddling_replicas(row.tp * row.cp * row.pp, row.gpus, pod)
    try:
        got = sorted(int(x) for x in answer)
    except (TypeError, ValueError):
        return wrong(f"give a list of replica indices (0 to {row.dp - 1}), got {answer!r}.")
    if got == want:
        return right(f"{len(want)} of the {row.dp} replicas span two pods.")
    if got == [r + 1 for r in want]:
        return wrong("count replicas from 0, as DP ranks are.")
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    return wrong(f"{len(missing)} straddling replica(s) missing, {len(extra)} listed that sit in one pod.")


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


__all__ = [n for n in dir() if n.startswith("check_")]
