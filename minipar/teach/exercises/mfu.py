"""The exercises of the MFU chapter (book/mfu.md), checked (see core.py for how).

- `check_predict_step_flops` (predict): the FLOPs of one training step of `tiny`,
  predicted, then counted by torch's FlopCounterMode on the real model;
- `check_attention_crossover` (predict): the sequence length at which attention's FLOPs
  per token equal the weights', found from the same counter at two lengths;
- `check_fixed_mfu` (bug): `buggy_mfu` below has two bugs; fix them;
- `check_predict_dp_bytes` (predict): predict what CommLog counts for ZeRO-1, then run it.
"""
from __future__ import annotations

import functools

import torch
from torch.utils.flop_counter import FlopCounterMode

from ...plan.config import ModelConfig, ParallelConfig, TrainConfig
from ...plan.costmodel import FP32, Workload, comm_bytes_per_gpu
from ...plan.datasheets import SHEETS
from ...plan.flops import mfu
from ...plan.flops import param_count
from ...trainer.model import Transformer, cross_entropy_sum
from ...trainer.step import Trainer
from ...runtime.run import train
from ...runtime.wire_meter import steps_by_axis
from .collectives import HEADERS_WHY, RING_NOT_GLOO
from .core import Verdict, compare_calls, exercise, predicted, yours

# torch's counter counts matmuls; the RMSNorm gains are parameters that do none (0.3% of
# tiny's, far less of a large model's), so a count within 1% has every matmul right.
COUNTED = 1e-2
WHY_COUNTED = ("torch counts the matmuls; the RMSNorm gains are parameters that do none, "
               "0.3% of tiny's")


def counted_flops(model: ModelConfig, batch: int, seq_len: int) -> int:
    """The FLOPs torch's FlopCounterMode counts in one forward and backward of the real
    `Transformer(model)` on `batch` sequences of `seq_len` tokens. On the meta device
    (shapes only, so Llama 3 405B costs nothing), where attention runs as two batched
    matmuls that the counter sees, the full square, as PaLM counts it."""
    with torch.device("meta"):
        net = Transformer(model, seed=None)
        tokens = torch.zeros(batch, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        cross_entropy_sum(net(tokens), tokens).backward()
    return counter.get_total_flops()


STEP = dict(model="tiny", batch=4, seq_len=256)


def step_flops() -> int:
    return counted_flops(ModelConfig.preset(STEP["model"]), STEP["batch"], STEP["seq_len"])


@exercise("mfu", "predict")
def check_predict_step_flops(prediction, reveal: bool = False) -> Verdict:
    """Predict the FLOPs of one training step (forward and backward) of `tiny` on 4
    sequences of 256 tokens; the check runs the step under torch's FlopCounterMode and
    reports counted / predicted."""
    m, tokens = ModelConfig.preset(STEP["model"]), STEP["batch"] * STEP["seq_len"]
    n = param_count(m, embeddings=False)
    return predicted(prediction, step_flops, "the FLOPs of one step", COUNTED, WHY_COUNTED,
                     reveal=reveal, hints=[
        (2 * n * tokens, "that is the forward's weight matmuls alone: the backward does "
                         "two matmuls for each of the forward's, and attention has its own."),
        (6 * param_count(m) * tokens, "the input embedding is a lookup, not a matmul, and "
                                      "attention's own matmuls are missing."),
        (6 * n * tokens, "the weight matmuls are right; attention's scores and weighted "
                         "sum are matmuls too, and grow with the sequence."),
    ])


def counted_per_token(model: ModelConfig, seq_len: int) -> float:
    return counted_flops(model, 1, seq_len) / seq_len


@functools.cache
def counted_crossover(model: ModelConfig) -> float:
    """The sequence length at which attention's FLOPs per token equal the rest's, from what
    torch's FlopCounterMode counts on the real model at two lengths: per token the count is
    a + b s (the weights' matmuls, then attention's scores and weighted sum), so s = a / b."""
    s1, s2 = 256, 512
    f1, f2 = counted_per_token(model, s1), counted_per_token(model, s2)
    slope = (f2 - f1) / (s2 - s1)
    return (f1 - slope * s1) / slope


@exercise("mfu", "predict")
def check_attention_crossover(prediction, model: str = "llama3-8b", reveal: bool = False) -> Verdict:
    """Predict the sequence length (tokens) at which attention's matmuls do as many FLOPs
    per token as the weights' matmuls, in a training step of `model`; the check counts the
    real model's FLOPs with torch's FlopCounterMode at two lengths (on the meta device) and
    finds where the two lines cross."""
    m = ModelConfig.preset(model)
    per_layer = 12 * m.n_layers * m.dim
    return predicted(prediction, lambda: counted_crossover(m), "the crossover length",
                     COUNTED, WHY_COUNTED, reveal=reveal, hints=[
        (6 * param_count(m) / per_layer, "the input embedding is a lookup, not a matmul: "
                                         "leave it out of N."),
        (6 * param_count(m, embeddings=False) / (per_layer / 2), "that halves attention for the "
         "causal mask, as Megatron does; torch counts the full square, as PaLM's convention does."),
        (2 * param_count(m, embeddings=False) / per_layer, "the weights do 6 N per token in "
         "a training step (forward and backward), not 2 N."),
    ])


def buggy_mfu(tokens_per_s: float, model: ModelConfig, seq_len: int, peak_flops: float,
              n_gpus: int) -> float:
    """An MFU as a fraction of the n_gpus' peak, in PaLM's convention. It has two bugs."""
    per_token = 6 * param_count(model)
    return tokens_per_s * per_token / (peak_flops * n_gpus)


H100_PEAK, A100_PEAK = SHEETS["H100"].peak_flops(), SHEETS["A100"].peak_flops()
MFU_CASES = [(1.2e6, ModelConfig.preset("llama3-405b"), 8192, H100_PEAK, 8192),
             (1.1e6, ModelConfig.preset("llama3-405b"), 131072, H100_PEAK, 16384),
             (3.0e4, ModelConfig(tie_embeddings=True), 128, 1e12, 2),
             (5.0e3, ModelConfig.preset("llama3.2-1b"), 4096, A100_PEAK, 1)]


@exercise("mfu", "bug")
def check_fixed_mfu(fn) -> Verdict:
    """fn(tokens_per_s, model, seq_len, peak_flops, n_gpus) -> MFU: `buggy_mfu` fixed.
    Checked against `flops.mfu` at 8K and 128K (where attention is most of the step), with
    tied and untied embeddings."""
    def hint(args, got, want):
        tps, m, s, peak, n = args
        att = 12 * m.n_layers * m.dim * s * tps / (peak * n)
        emb = 6 * m.vocab_size * m.dim * tps / (peak * n)
        if abs(got - (want - att)) < 1e-9 * want or abs(got - (want - att + emb)) < 1e-9 * want:
            return f"at seq_len {s:,} you leave out attention's 12 L h s FLOPs per token."
        if abs(got - (want + emb)) < 1e-9 * want:
            return "the input embedding is a lookup, not a matmul: it is not in N."
        return f"at seq_len {s:,}, {m.name}: MFU {got:.4f}, off by a factor of {got / want:.4g}."
    return compare_calls(fn, MFU_CASES, lambda *a: mfu(*a), 1e-9, hint,
                         "both bugs fixed: N without the embedding lookup, and attention counted.",
                         call=lambda args: f"{yours(fn)}({args[0]:.3g}, {args[1].name}, {args[2]}, ...)")


DP_RUN = dict(dp=2, zero=1, global_batch=4, seq_len=32)




def dp_run_bytes() -> int:
    """Run `python -m minipar.train --dp 2 --zero 1` on the tiny model (fp32, one step) on
    gloo and return the bytes rank 0 wrote to its sockets for the DP axis (`wire`)."""
    pc = ParallelConfig(dp=DP_RUN["dp"], zero=DP_RUN["zero"])
    with steps_by_axis(Trainer):
        run = train(TrainConfig(parallel=pc, global_batch=DP_RUN["global_batch"],
                                seq_len=DP_RUN["seq_len"], steps=1, progress=False))
    return run["records"][-1]["wire"]["dp"]


def dp_model_bytes() -> int:
    """What the cost model predicts rank 0 sends on the DP axis in that run (the ring's)."""
    pc = ParallelConfig(dp=DP_RUN["dp"], zero=DP_RUN["zero"])
    work = Workload(seq_len=DP_RUN["seq_len"], global_batch=DP_RUN["global_batch"], microbatch_size=1)
    return comm_bytes_per_gpu(ModelConfig.preset("tiny"), pc, work, FP32)["dp"]


@exercise("mfu", "predict")
def check_predict_dp_bytes(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes rank 0 sends on the DP axis in one step of the tiny model (fp32)
    under `--dp 2 --zero 1` on gloo; the check then runs it (or takes `measured`, from a run
    you made), measures what rank 0 wrote to its sockets for DP, and reports run / prediction."""
    return predicted(prediction, dp_run_bytes if measured is None else measured,
                     "the DP bytes of rank 0 in one step", 0.01, HEADERS_WHY, unit="B",
                     reveal=reveal, hints=[
        (dp_model_bytes(), RING_NOT_GLOO + " The cost model counts the ring too."),
    ])


__all__ = [n for n in dir() if n.startswith("check_")]
