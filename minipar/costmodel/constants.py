"""The numbers the cost model does not derive: efficiencies, precisions, Llama 3's batch.

Chapter "MFU and communication volume". Everything else is counted from the model and the
layout; these are the few constants measured elsewhere (one set for every row of Llama 3's
Table 4, justified in the chapter) and the bytes per element of each kind of tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..flops import RECOMPUTE

__all__ = ["RECOMPUTE", "TABLE4_BATCH_TOKENS", "Efficiency", "LLAMA3_EFFICIENCY",
           "CAUSAL_FRACTION", "Precision", "BF16_MIXED", "FP32", "PRECISIONS"]

TABLE4_BATCH_TOKENS = 2048 * 8192          # "16M tokens per batch": 2048 sequences of 8K


@dataclass(frozen=True)
class Efficiency:
    """The only three numbers the model does not derive. One set for every configuration.

    dense:     fraction of peak reached by a layer's weight matmuls *together with* the
               memory-bound kernels between them (norms, SwiGLU, RoPE, residual adds, casts)
               and everything else this model ignores (launch gaps, stragglers, the
               optimizer step). A large bf16 GEMM on a 700 W H100 sustains ~65-75% of the
               989 TFLOP/s data-sheet number; the rest of a layer costs a quarter of that.
    attention: fraction of peak reached by the fused (flash) attention kernels, forward and
               backward, on the FLOPs they really do: half the s x s square under a causal
               mask. FlashAttention-2 reports up to 335 TFLOP/s on H100 (no Hopper-specific
               instructions), counting its backward as 2.5 forwards: ~0.29 of peak in our
               1 + 2 counting, before document masks and the power cap.
    network:   fraction of a link's bandwidth a collective achieves (nccl-tests' "bus
               bandwidth" over the link rate: ~360 of 450 GB/s on NVLink, ~40 of 50 GB/s on
               400G RoCE).
    """

    dense: float = 0.52
    attention: float = 0.22
    network: float = 0.8


LLAMA3_EFFICIENCY = Efficiency()
CAUSAL_FRACTION = 0.5       # a causal kernel computes half of the s x s square


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a GPU stores and sends."""

    param_bytes: int = 2        # the weights the matmuls read (and ZeRO all-gathers)
    grad_bytes: int = 4         # gradients as accumulated and reduced
    act_bytes: int = 2          # activations, and what TP, CP and PP send
    optimizer_bytes: int = 12   # per parameter: Adam's m and v (+ fp32 master weights)


# Llama 3: bf16 weights and activations; "FP32 gradient accumulation during backward
# computation over multiple micro-batches and also reduce-scatter gradients in FP32"
# (section 3.3.2); fp32 master weights and Adam moments.
BF16_MIXED = Precision(param_bytes=2, grad_bytes=4, act_bytes=2, optimizer_bytes=12)
# minipar on CPU: everything float32, Adam's two moments, no separate master copy.
FP32 = Precision(param_bytes=4, grad_bytes=4, act_bytes=4, optimizer_bytes=8)
PRECISIONS = {"bf16": BF16_MIXED, "fp32": FP32}
