"""The numbers the cost model does not derive, each with where it comes from.

Chapter "MFU and communication volume". Everything else is counted from the model, the
layout and the GPU's data sheet. These are measurements of the hardware: the kernels a
step is made of, timed on a Hopper GPU by `benchmarks/kernels/measure.py` (its output is
`data/kernels_h200.json`), NCCL's own latency model and the bus bandwidth nccl-tests
report. **None is fitted to an MFU**: the published runs are what the model is judged on
(`evaluate.py`). `catalog.py` lists them all, with their sources
(`python -m minipar.costmodel constants [--json]`).
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TABLE4_BATCH_TOKENS", "KERNELS", "KERNELS_FILE", "GEMM_TABLE",
           "Efficiency", "LLAMA3_EFFICIENCY", "CP_ATTENTION", "cp_attention_tflops", "STREAM_FRACTION", "CAUSAL_FRACTION",
           "FUSED_ELEMENTWISE", "GEMM_CURVE", "NCCL_LATENCY_US", "FABRIC_FILES", "FABRIC_CURVES", "FABRIC_SMALLEST", "fabric_busbw_GBps",
           "Precision", "BF16_MIXED", "FP32", "PRECISIONS", "MEASURED_PEAK_TFLOPS"]

TABLE4_BATCH_TOKENS = 2048 * 8192          # "16M tokens per batch": 2048 sequences of 8K
CAUSAL_FRACTION = 0.5       # a causal kernel computes half of the s x s square

KERNELS_FILE = Path(__file__).parent / "data" / "kernels_h200.json"
KERNELS = json.loads(KERNELS_FILE.read_text())
# One all-gather CP rank's attention: its two chunks of s / 2cp queries against every key up
# to each chunk's end, lower-right causal (benchmarks/kernels/cp_attention.py, CP16 at 131K)
CP_ATTENTION = json.loads((KERNELS_FILE.parent / "cp_attention_h200.json").read_text())
MEASURED_PEAK_TFLOPS = 989.4      # the H200's dense bf16 data sheet number, the H100 SXM's too
MEASURED_HBM_TBps = 4.8           # the H200's HBM3e; memory-bound kernels scale by this


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


# {(m, n, k): seconds} of every GEMM measured
GEMM_TABLE = {(g["m"], g["n"], g["k"]): g["s"] for g in KERNELS["gemms"]}


def _interpolate(x: float, points: list[tuple[float, float]]) -> float:
    """y at x on a curve of (x, y) points, linear in log x, flat beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return points[-1][1]


def _attention_curve(rows: list[dict]) -> list[tuple[float, float]]:
    """(sequence length, forward + backward TFLOP/s) of one kernel, by length: causal FLOPs
    (half the square), the backward counted as twice the forward."""
    return [(r["seq"], 3 * r["flops_fwd"] / r["fwd_bwd_s"] / 1e12) for r in rows]


ATTENTION_CURVES = {kernel: _attention_curve(rows) for kernel, rows in KERNELS["attention"].items()}


def attention_tflops(kernel: str, block: float) -> float:
    """Measured TFLOP/s of an attention kernel on `block`-token sequences (`ATTENTION_CURVES`),
    interpolated in log(block) between the measured lengths (`_interpolate`), flat beyond
    the longest, launch-bound (proportional to the length) below the shortest."""
    curve = ATTENTION_CURVES[kernel]
    shortest, speed = curve[0]
    if block <= shortest:
        return speed * max(block, 1.0) / shortest
    return _interpolate(block, curve)


CP_ATTENTION_TFLOPS = {kernel: median([r["flops"] / r["fwd_bwd_s"] / 1e12 for r in ranks])
                       for kernel, ranks in CP_ATTENTION["ranks"].items()}


def cp_attention_tflops(kernel: str) -> float:
    """Measured TFLOP/s of one all-gather CP rank's chunked attention (median over ranks)."""
    return CP_ATTENTION_TFLOPS[kernel]


def _gemm_curve() -> tuple[float, float, float]:
    """(e, w, t0) of t = F / (e P) + B / (w W) + t0 by least squares, relative error, over
    every measured GEMM: the kernel curve for shapes nobody measured. A fit of a kernel
    curve to a kernel benchmark, not to any MFU."""
    rows = KERNELS["gemms"] + KERNELS["square"]
    a = [[2 * r["m"] * r["n"] * r["k"] / (MEASURED_PEAK_TFLOPS * 1e12) / r["s"],
          2 * (r["m"] * r["k"] + r["k"] * r["n"] + r["m"] * r["n"]) / (MEASURED_HBM_TBps * 1e12) / r["s"],
          1 / r["s"]] for r in rows]
    # normal equations of min sum (a x - 1)^2, three unknowns, solved by Cramer's rule
    ata = [[sum(r[i] * r[j] for r in a) for j in range(3)] for i in range(3)]
    atb = [sum(r[i] for r in a) for i in range(3)]

    def det(m):
        return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    d = det(ata)
    x = [det([[atb[r] if c == i else ata[r][c] for c in range(3)] for r in range(3)]) / d for i in range(3)]
    return 1 / x[0], 1 / x[1], x[2]


STREAM_FRACTION = KERNELS["hbm"]["copy_Bps"] / (MEASURED_HBM_TBps * 1e12)
GEMM_CURVE = _gemm_curve()
FUSED_ELEMENTWISE = 1.0
# NCCL's own latency model (src/graph/tuning.cc, NVIDIA/nccl v2.18-2.21): a collective pays
# a base latency, then each ring step its link's: Ring/Simple protocol, microseconds.
NCCL_LATENCY_US = {"base": 8.4, "nvlink_step": 3.4, "net_step": 14.0, "net_overhead": 3.0}
# Bus bandwidth (nccl-tests' busbw) over the link's data-sheet rate: NVLink 4 inside an
# HGX H100 (ring all-reduce ~370 of 450 GB/s, NCCL maintainers' numbers on NVIDIA/nccl's
# issues) and a 400 Gb/s InfiniBand NDR / RoCE NIC per GPU across servers (~46 of 50 GB/s
# in nccl-tests across nodes).
NVLINK_BUSBW_FRACTION = 370 / 450
NIC_BUSBW_FRACTION = 46 / 50

# A fabric that nccl-tests have been run on, message size by message size and server count by
# server count: the bus bandwidth is then read off its measurements instead of alpha-beta.
# AWS's Elastic Fabric Adapter (p5.48xlarge, 400 Gb/s per GPU as 4 x 100 Gb/s) reaches line
# rate only for messages of gigabytes, and less the more servers a ring crosses.
FABRIC_FILES = {"efa": KERNELS_FILE.parent / "nccl_tests_efa_p5.csv"}


def _fabric_curves(path: Path) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """{op: {servers: [(bytes, bus GB/s), ...] by size}} of one fabric's nccl-tests."""
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    out: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for row in csv.DictReader(lines):
        point = (float(row["size_mb"]) * 2 ** 20, float(row["busbw_GBps"]))
        out.setdefault(row["op"], {}).setdefault(int(row["nodes"]), []).append(point)
    return {op: {n: sorted(pts) for n, pts in curves.items()} for op, curves in out.items()}


FABRIC_CURVES = {name: _fabric_curves(path) for name, path in FABRIC_FILES.items()}
# the smallest message each fabric was measured with
FABRIC_SMALLEST = {name: min(pts[0][0] for by_nodes in curves.values() for pts in by_nodes.values())
                   for name, curves in FABRIC_CURVES.items()}


def fabric_busbw_GBps(fabric: str, op: str, servers: int, size: float) -> float:
    """nccl-tests' bus bandwidth of `op` on `fabric` (whole servers in the ring) for a
    message of `size` bytes over `servers` servers, interpolated in log size and log servers
    between the measured points and flat beyond them (the reduce-scatter, which has no
    measurement, runs the all-gather's ring). Below the smallest size measured the caller
    adds NCCL's latency (`hardware.measured_collective_seconds`)."""
    curves = FABRIC_CURVES[fabric]["all_gather" if op == "reduce_scatter" else op]
    counts = sorted(curves)
    at = [(n, _interpolate(size, curves[n])) for n in counts]
    return _interpolate(min(max(servers, counts[0]), counts[-1]), at)


@dataclass(frozen=True)
class Efficiency:
    """How a software stack reaches the hardware: which kernels it runs and how much of the
    links NCCL gets. Every field is a measurement or a named kernel (`frameworks` picks one
    per stack); none is fitted to an MFU.

    network:       NVLink bus bandwidth / data-sheet rate (nccl-tests)
    network_inter: the NIC's, across servers
    attention:     the attention kernel: "flash2" (FlashAttention-2, as PyTorch's SDPA
                   ships it) or "cudnn" (cuDNN's fused attention, Transformer Engine's
                   default on Hopper), each timed by measure.py
    elementwise:   bytes the norms, RoPE, SwiGLU and residual adds really move over the
                   bytes `kernels` counts: 1 for fused kernels, EAGER_ELEMENTWISE (measured)
                   for eager PyTorch, one kernel per op
    cross_entropy: "fused" (one kernel over the logits) or "eager" (op by op in fp32)
    overhead:      fraction of compute lost to what the model does not count. 0: a free
                   factor would hide what the physics misses.
    """

    network: float = NVLINK_BUSBW_FRACTION
    network_inter: float = NIC_BUSBW_FRACTION
    attention: str = "cudnn"
    elementwise: float = FUSED_ELEMENTWISE
    cross_entropy: str = "fused"
    overhead: float = 0.0

    @property
    def links(self) -> tuple[float, float]:
        """(inside a server, across servers): what `hardware.axis_seconds` takes."""
        return self.network, self.network_inter


# Llama 3's stack: the paper names no kernels; a Hopper-tuned attention and fused pointwise
# kernels are assumed (`frameworks.LLAMA3` says so).
LLAMA3_EFFICIENCY = Efficiency()




@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a GPU stores and sends."""

    param_bytes: int = 2        # the weights the matmuls read (and ZeRO all-gathers)
    grad_bytes: int = 4         # gradients as accumulated
    act_bytes: int = 2          # activations, and what TP, CP and PP send
    optimizer_bytes: int = 12   # per parameter: Adam's m and v (+ fp32 master weights)
    reduce_bytes: int = 4       # gradients as data parallelism reduces them

    @property
    def state_bytes_per_param(self) -> int:
        """Weights, gradients and optimizer state: what each parameter costs before sharding."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


# Llama 3: bf16 weights and activations; "FP32 gradient accumulation during backward
# computation over multiple micro-batches and also reduce-scatter gradients in FP32"
# (section 3.3.2); fp32 master weights and Adam moments.
BF16_MIXED = Precision(param_bytes=2, grad_bytes=4, act_bytes=2, optimizer_bytes=12, reduce_bytes=4)
# minipar on CPU: everything float32, Adam's two moments, no separate master copy.
FP32 = Precision(param_bytes=4, grad_bytes=4, act_bytes=4, optimizer_bytes=8, reduce_bytes=4)
PRECISIONS = {"bf16": BF16_MIXED, "fp32": FP32}
