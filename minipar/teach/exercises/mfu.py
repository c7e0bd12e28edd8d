"""The exercises of the MFU chapter, checked (see core.py for how)."""
from __future__ import annotations

from ...config import ModelConfig
from ...flops import dense_flops_per_token, flops_per_token, mfu
from .core import Verdict, compare_calls, exercise, number


@exercise("mfu", "number")
def check_mfu(model: ModelConfig, seq_len: int, tokens_per_s: float, n_gpus: int,
              peak_flops: float, answer) -> Verdict:
    """MFU (a fraction, PaLM's 6N + 12 L h s convention) of n_gpus processing tokens_per_s."""
    want = mfu(tokens_per_s, model, seq_len, peak_flops, n_gpus)
    dense = tokens_per_s * dense_flops_per_token(model) / (peak_flops * n_gpus)
    return number(answer, want, "MFU", rel=5e-3, hints=[
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


__all__ = [n for n in dir() if n.startswith("check_")]
