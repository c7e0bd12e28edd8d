"""The numbers the cost model does not derive: efficiencies, precisions, Llama 3's batch.

Chapter "MFU and communication volume". Everything else is counted from the model, the
layout and the GPU's data sheet; these are the few constants fitted on published runs (one
set for every run, `fit.py`), the two measured elsewhere, and the bytes per element of
each kind of tensor.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


__all__ = ["TABLE4_BATCH_TOKENS", "Efficiency", "LLAMA3_EFFICIENCY",
           "FITTED", "CONSTANTS_FILE", "load_efficiency", "MEMORY_BOUND_EFFICIENCY",
           "ATTENTION_HALF_SEQ", "CAUSAL_FRACTION", "Precision", "BF16_MIXED", "FP32", "PRECISIONS"]

TABLE4_BATCH_TOKENS = 2048 * 8192          # "16M tokens per batch": 2048 sequences of 8K


@dataclass(frozen=True)
class Efficiency:
    """The numbers the model does not derive: fitted by `python -m minipar.costmodel.fit` on
    the published runs of `data/published_runs.csv` alone, and loaded from
    `data/constants.json` (the defaults below are that file's values when it is missing).

    dense:     fraction of the peak a large bf16 GEMM sustains in a training step (the
               roofline's flat part; a thin GEMM gets less, `kernels.matmul_seconds`). A
               700 W H100 sustains ~65-75% of its 989 TFLOP/s data-sheet number.
    attention: fraction of the peak flash attention approaches on long blocks, forward and
               backward, on the FLOPs it really does (half the causal square).
    network:   fraction of NVLink's bandwidth a collective inside a server achieves
               (nccl-tests' "bus bandwidth" over the link rate).
    network_inter: the same fraction for the NICs across servers (RDMA over a switched
               fabric reaches less of its line rate than NVLink does).
    overhead:  fraction of each micro-batch's compute lost to what this model does not
               count (launch gaps, synchronisation, stragglers, Python). Not fitted (0):
               a free fudge factor would hide what the physics misses.
    """

    dense: float = 0.7
    attention: float = 0.4
    network: float = 0.8
    overhead: float = 0.0
    network_inter: float = 0.8

    @property
    def links(self) -> tuple[float, float]:
        """(inside a server, across servers): what `hardware.axis_seconds` takes."""
        return self.network, self.network_inter


FITTED = ("dense", "attention", "network", "network_inter")
CONSTANTS_FILE = Path(__file__).parent / "data" / "constants.json"


def load_efficiency(path: Path = CONSTANTS_FILE) -> Efficiency:
    """The fitted constants from `path` (`fit.py` writes it), or the defaults."""
    try:
        fitted = json.loads(path.read_text())["constants"]
    except FileNotFoundError:
        return Efficiency()
    return Efficiency(**{k: float(fitted[k]) for k in FITTED if k in fitted})


LLAMA3_EFFICIENCY = load_efficiency()     # one set of constants for every run
CAUSAL_FRACTION = 0.5       # a causal kernel computes half of the s x s square
# Not fitted, measured elsewhere: streaming kernels (norms, adds) reach ~80% of HBM's data
# sheet bandwidth; FlashAttention-2's throughput halves at ~512-token blocks (its paper's
# sequence-length sweeps).
MEMORY_BOUND_EFFICIENCY = 0.8
ATTENTION_HALF_SEQ = 512


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
