"""The exercises of the MFU chapter (book/mfu.md), checked (see core.py for how).

- `check_mfu` (number): the MFU of a Llama 3 step;
- `check_flops_per_token` (implement): 6 N + 12 L h s;
- `check_fixed_mfu` (bug): `buggy_mfu` below has two bugs; fix them;
- `check_predict_dp_bytes` (predict): predict what CommLog counts for ZeRO-1, then run it.
"""
from __future__ import annotations

from ...config import ModelConfig, ParallelConfig, TrainConfig
from ...costmodel import FP32, Workload, comm_bytes_per_gpu
from ...flops import dense_flops_per_token, flops_per_token, mfu
from ...flops import param_count
from ...train import train
from .core import Verdict, compare_calls, exercise, number, predicted


@exercise("mfu", "number")
def check_mfu(model: ModelConfig, seq_len: int, tokens_per_s: float, n_gpus: int,
              peak_flops: float, answer) -> Verdict:
    """MFU (a fraction, PaLM's 6N + 12 L h s convention) of n_gpus processing tokens_per_s."""
    want = mfu(tokens_per_s, model, seq_len, peak_flops, n_gpus)
    dense = tokens_per_s * dense_flops_per_token(model) / (peak_flops * n_gpus)
    return number(answer, want, "the MFU", rel=5e-3, hints=[
        (100 * want, "give MFU as a fraction (0.43), not a percentage."),
        (dense, "that leaves out attention: PaLM's convention adds 12 L h s per token."),
        (want * n_gpus, "the peak is per GPU: divide by all the GPUs' peak."),
    ])


@exercise("mfu", "implement")
def check_flops_per_token(fn) -> Verdict:
    """fn(model, seq_len) -> model FLOPs per token, PaLM's convention."""
    cases = [(ModelConfig(), 128), (ModelConfig(tie_embeddings=True), 64),
             (ModelConfig.preset("llama3-405b"), 8192)]
    return compare_calls(
        fn, cases, flops_per_token, 1e-9,
        lambda args, got, want: f"for {args[0].name} at seq_len {args[1]} you count {got:.4g} "
                                f"FLOPs per token, off by a factor of {got / want:.4g}.",
        "6 N + 12 L h s, for three models.", call=lambda args: f"fn({args[0].name}, {args[1]})")


def buggy_mfu(tokens_per_s: float, model: ModelConfig, seq_len: int, peak_flops: float,
              n_gpus: int) -> float:
    """An MFU as a fraction of the n_gpus' peak, in PaLM's convention. It has two bugs."""
    per_token = 6 * param_count(model)
    return tokens_per_s * per_token / (peak_flops * n_gpus)


MFU_CASES = [(1.2e6, ModelConfig.preset("llama3-405b"), 8192, 989e12, 8192),
             (1.1e6, ModelConfig.preset("llama3-405b"), 131072, 989e12, 16384),
             (3.0e4, ModelConfig(tie_embeddings=True), 128, 1e12, 2),
             (5.0e3, ModelConfig.preset("llama3.2-1b"), 4096, 312e12, 1)]


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
                         call=lambda args: f"fn({args[0]:.3g}, {args[1].name}, {args[2]}, ...)")


DP_RUN = dict(dp=2, zero=1, global_batch=4, seq_len=32)


def dp_run_bytes() -> int:
    """Run `python -m minipar.train --dp 2 --zero 1` on the tiny model (fp32, one step) and
    return the DP bytes rank 0's CommLog counts."""
    pc = ParallelConfig(dp=DP_RUN["dp"], zero=DP_RUN["zero"])
    run = train(TrainConfig(parallel=pc, global_batch=DP_RUN["global_batch"], seq_len=DP_RUN["seq_len"],
                            steps=1, progress=False))
    return sum(op["wire_bytes"] for op in run["records"][-1]["comm"]["dp"].values())


def dp_model_bytes() -> int:
    """What the cost model predicts rank 0 sends on the DP axis in that run."""
    pc = ParallelConfig(dp=DP_RUN["dp"], zero=DP_RUN["zero"])
    work = Workload(seq_len=DP_RUN["seq_len"], global_batch=DP_RUN["global_batch"], microbatch_size=1)
    return comm_bytes_per_gpu(ModelConfig.preset("tiny"), pc, work, FP32)["dp"]


@exercise("mfu", "predict")
def check_predict_dp_bytes(prediction, measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the bytes rank 0 sends on the DP axis in one step of the tiny model (fp32)
    under `--dp 2 --zero 1`; the check then runs it (or takes `measured`, from a run you
    made) and reports run / prediction. Bytes are counted exactly, so exact is right."""
    return predicted(prediction, dp_run_bytes if measured is None else measured,
                     "the DP bytes of rank 0 in one step", 1e-9,
                     "CommLog counts the ring's bytes exactly", unit="B", reveal=reveal)


__all__ = [n for n in dir() if n.startswith("check_")]
