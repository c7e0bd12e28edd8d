"""The exercises of the memory chapter, checked (see core.py for how).

Predict a rank's activation bytes and let `ActivationMeter` measure them; find the bug in
a recompute wrapper (checked at every step against no recomputation, parameter by
parameter, and against a memory budget the check enforces); make Llama 3 70B fit an
H100; predict the model-state bytes per parameter of a ZeRO-1 run, then run it.
"""
from __future__ import annotations

import torch

from ...plan.config import ModelConfig, ParallelConfig, TrainConfig
from ...plan.flops import param_count
from ...trainer.memory_meter import ActivationMeter
from ...trainer.model import Transformer, cross_entropy_sum
from ...runtime.run import train
from .core import (FLOAT32, Verdict, at, exercise, first_difference, function_given,
                   predicted, right, wrong)
from .critique import Setting, critiqued

PREDICT_BATCH = (4, 32)        # sequences x tokens of the predict exercise
RECOMPUTE_STEPS, LR = 2, 0.1   # two SGD steps: the second starts from the first's update
RECOMPUTE_BUDGET = 0.5         # of what no recomputation keeps
FIT = dict(model="llama3-70b", gpus=16, seq_len=8192, global_batch_tokens=2**21, hbm_gib=80)


def _batch(step: int = 0):
    gen = torch.Generator().manual_seed(step)
    x = torch.randint(0, 256, PREDICT_BATCH, generator=gen)
    return x, x.roll(-1, 1)


def measured_activations(recompute=None, step: int = 0, model=None) -> int:
    """Peak bytes autograd keeps in one forward and backward of `tiny` (ActivationMeter)."""
    model = model or Transformer(ModelConfig.preset("tiny"), seed=0)
    x, y = _batch(step)
    with ActivationMeter() as meter:
        cross_entropy_sum(model(x), y).backward()
    return meter.peak


@exercise("memory", "predict")
def check_predict_activations(prediction, reveal: bool = False) -> Verdict:
    """Predict the peak activation bytes of `tiny` on one rank, 4 sequences of 32 tokens,
    float32, no recomputation; the check measures them with ActivationMeter."""
    return predicted(prediction, measured_activations, "the peak activation bytes", rel=1e-3,
                     why="the chapter's count is tensor by tensor: a prediction that counts "
                         "every tensor is exact, one that misses a part is off by more",
                     unit="B", reveal=reveal)


# ----------------------------------------------------------------- find the bug: recompute
class ForgetsTheWeights(torch.autograd.Function):
    """The autograd Function behind `buggy_recompute` (the notebook prints its source)."""

    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn = fn
        ctx.save_for_backward(x)
        return fn(x)                       # autograd.Function.forward runs without grad

    @staticmethod
    def backward(ctx, dy):
        x, = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.enable_grad():
            y = ctx.fn(x)                  # the forward again, this time with a graph
        dx, = torch.autograd.grad(y, (x,), dy)
        return None, dx


def buggy_recompute(fn, x):
    """Full recomputation of one block, with a bug (the exercise): keep only the block's
    input x; in the backward, run fn(x) again and backpropagate through it."""
    return ForgetsTheWeights.apply(fn, x)


def _wrap_blocks(model, recompute):
    """Every block of `model` runs through recompute(fn, x), fn the block at fixed cos, sin."""
    for block in model.layers.values():
        forward = block.forward

        def wrapped(x, cos, sin, forward=forward):
            return recompute(lambda h: forward(h, cos, sin), x)
        block.forward = wrapped
    return model


def _recompute_problem(recompute) -> str | None:
    tiny = ModelConfig.preset("tiny")
    ref, mine = Transformer(tiny, seed=0), _wrap_blocks(Transformer(tiny, seed=0), recompute)
    for step in range(RECOMPUTE_STEPS):
        budget = RECOMPUTE_BUDGET * measured_activations(step=step, model=ref)
        peak = measured_activations(step=step, model=mine)
        if peak > budget:
            return at(step, 0, f"the meter saw {peak:,} bytes kept for the backward, over the "
                               f"budget of {budget:,.0f} ({RECOMPUTE_BUDGET:.0%} of no "
                               f"recomputation): the wrapper keeps more than the block's input.")
        for (name, p), q in zip(ref.named_parameters(), mine.parameters()):
            if q.grad is None:
                return at(step, 0, f"{name}.grad is None: the backward never reached this weight.")
            problem = first_difference(q.grad, p.grad, f"{name}.grad", FLOAT32)
            if problem:
                return at(step, 0, problem)
        with torch.no_grad():
            for model in (ref, mine):
                for p in model.parameters():
                    p -= LR * p.grad
                    p.grad = None
    return None


@exercise("memory", "bug")
def check_recompute(recompute) -> Verdict:
    """recompute(fn, x) -> fn(x), keeping only x for the backward: the fixed `buggy_recompute`.
    Wrapped around every block of `tiny`; checked at each of two SGD steps against no
    recomputation (every gradient) and against a memory budget (the meter's peak)."""
    problem = function_given(recompute)
    if problem is not None:
        return problem
    try:
        problem = _recompute_problem(recompute)
    except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
        return wrong(f"your wrapper raised {type(e).__name__}: {e}")
    if problem:
        return wrong(problem)
    return right(f"every gradient matches no recomputation at every step, and the blocks "
                 f"keep at most {RECOMPUTE_BUDGET:.0%} of the activations.")


# ----------------------------------------------------------------- will it fit?
# Llama 3 70B on four servers of H100s, 8K tokens, 2M-token batches, bf16 mixed precision:
# two servers hold no layout under the planner's headroom, four hold several hundred.
FIT = Setting(model="llama3-70b", gpus=32, seq_len=8192, batch_tokens=2**21)


@exercise("memory", "design")
def check_will_it_fit(layout) -> Verdict:
    """layout: a dict of tp, cp, pp, dp (the rest of the GPUs by default), zero (0-3),
    recompute, schedule, virtual_stages, microbatch_size for FIT. Right when the fullest
    GPU fits in the HBM less the planner's headroom (`planner.memory_budget_gb`, by the
    cost model's count) and TP's rings stay on one server's NVLink; otherwise the verdict
    names the part that overflows and what shrinks it. The planner's MFU is a note."""
    return critiqued(FIT, layout)


STATE_RUN = dict(dp=2, zero=1, global_batch=4, seq_len=32)   # tiny, fp32, one step


def measured_state_bytes_per_param() -> float:
    """Run `python -m minipar.train --dp 2 --zero 1` on `tiny` (fp32, one step) and return
    the model state (parameters, gradients, optimizer state) of its fullest rank, counted
    from the tensors by the step's `memory` record, per parameter of the model."""
    pc = ParallelConfig(dp=STATE_RUN["dp"], zero=STATE_RUN["zero"])
    run = train(TrainConfig(parallel=pc, global_batch=STATE_RUN["global_batch"],
                            seq_len=STATE_RUN["seq_len"], steps=1, progress=False))
    held = run["records"][-1]["memory"]
    return (held["params"] + held["grads"] + held["optimizer"]) / param_count(ModelConfig.preset("tiny"))


@exercise("memory", "predict")
def check_bytes_per_param(prediction, measured: float | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes of model state per parameter that one rank of
    `python -m minipar.train --dp 2 --zero 1` holds (tiny, float32, AdamW); the check runs
    one step on two gloo ranks (or takes `measured`) and reports run / prediction."""
    return predicted(prediction, measured_state_bytes_per_param if measured is None else measured,
                     "the model-state bytes per parameter", 1e-3,
                     "the trainer counts the tensors a rank holds; every tensor of tiny halves evenly",
                     unit="B", reveal=reveal, hints=[
        (16.0, "that is the state without ZeRO: ZeRO-1 shards part of it over the DP ranks."),
        (18.0, "that is Llama 3's mixed precision (bf16 weights, fp32 master copy); this run is "
               "float32 throughout, with no separate master copy."),
    ])


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_recompute"]
