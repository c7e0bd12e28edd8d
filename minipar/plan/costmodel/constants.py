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
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..datasheets import SHEETS
from .untrusted import read_json, reading

TABLE4_BATCH_TOKENS = 2048 * 8192          # "16M tokens per batch": 2048 sequences of 8K
CAUSAL_FRACTION = 0.5       # a causal kernel computes half of the s x s square

# The measurement files are read when a number is first asked for (each loader below is
# cached), never on import: importing the cost model costs nothing.
DATA = Path(__file__).parent / "data"
KERNELS_FILE = DATA / "kernels_h200.json"
# One all-gather CP rank's attention: its two chunks of s / 2cp queries against every key up
# to each chunk's end, lower-right causal (benchmarks/kernels/cp_attention.py, CP16 at 131K)
CP_ATTENTION_FILE = DATA / "cp_attention_h200.json"
# The measuring GPU's data sheet: compute scales by its peak, memory-bound kernels by its HBM
MEASURED_PEAK_TFLOPS = SHEETS["H200"].bf16_tflops
MEASURED_HBM_TBps = SHEETS["H200"].hbm_TBps


@functools.cache
def measurements() -> dict:
    """Every kernel `benchmarks/kernels/measure.py` timed (`data/kernels_h200.json`); a
    damaged copy is a `DataError` naming it."""
    block = ("dim", "ffn", "heads", "kv", "head_dim", "vocab", "tp", "tokens", "seq", "fwd_bwd_s")
    return read_json(KERNELS_FILE, {"gemms": ("m", "n", "k", "s"), "square": ("m", "n", "k", "s"),
                                    "hbm": ("copy_Bps",), "attention": ("seq", "flops_fwd", "fwd_bwd_s"),
                                    "cross_entropy": ("tokens", "vocab", "fused_s", "eager_s"),
                                    "layers": block})


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


@functools.cache
def gemm_table() -> dict[tuple[int, int, int], float]:
    """{(m, n, k): seconds} of every GEMM measured."""
    return {(g["m"], g["n"], g["k"]): g["s"] for g in measurements()["gemms"]}


def _interpolate(x: float, points: list[tuple[float, float]]) -> float:
    """y at x on a curve of (x, y) points, linear in log x, flat beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return points[-1][1]


@functools.cache
def attention_curve(kernel: str) -> list[tuple[float, float]]:
    """(sequence length, forward + backward TFLOP/s) of one kernel, by length: causal FLOPs
    (half the square), the backward counted as twice the forward."""
    return [(r["seq"], 3 * r["flops_fwd"] / r["fwd_bwd_s"] / 1e12)
            for r in measurements()["attention"][kernel]]


def attention_tflops(kernel: str, block: float) -> float:
    """Measured TFLOP/s of an attention kernel on `block`-token sequences (`attention_curve`),
    interpolated in log(block) between the measured lengths (`_interpolate`), flat beyond
    the longest, launch-bound (proportional to the length) below the shortest."""
    curve = attention_curve(kernel)
    shortest, speed = curve[0]
    if block <= shortest:
        return speed * max(block, 1.0) / shortest
    return _interpolate(block, curve)


@functools.cache
def cp_attention_tflops(kernel: str) -> float:
    """Measured TFLOP/s of one all-gather CP rank's chunked attention (median over ranks)."""
    with reading(CP_ATTENTION_FILE):
        ranks = json.loads(CP_ATTENTION_FILE.read_text())["ranks"][kernel]
        return median([r["flops"] / r["fwd_bwd_s"] / 1e12 for r in ranks])


@functools.cache
def gemm_curve() -> tuple[float, float, float]:
    """(e, w, t0) of t = F / (e P) + B / (w W) + t0 by least squares, relative error, over
    every measured GEMM: the kernel curve for shapes nobody measured. A fit of a kernel
    curve to a kernel benchmark, not to any MFU."""
    rows = measurements()["gemms"] + measurements()["square"]
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


@functools.cache
def stream_fraction() -> float:
    """What a device copy reaches of the HBM's data-sheet bandwidth, measured."""
    return measurements()["hbm"]["copy_Bps"] / (MEASURED_HBM_TBps * 1e12)


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
FABRIC_FILES = {"efa": DATA / "nccl_tests_efa_p5.csv"}


@functools.cache
def fabric_curves(fabric: str) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """{op: {servers: [(bytes, bus GB/s), ...] by size}} of one fabric's nccl-tests."""
    with reading(FABRIC_FILES[fabric]):
        lines = [line for line in FABRIC_FILES[fabric].read_text().splitlines() if not line.startswith("#")]
        out: dict[str, dict[int, list[tuple[float, float]]]] = {}
        for row in csv.DictReader(lines):
            point = (float(row["size_mb"]) * 2 ** 20, float(row["busbw_GBps"]))
            out.setdefault(row["op"], {}).setdefault(int(row["nodes"]), []).append(point)
    return {op: {n: sorted(pts) for n, pts in curves.items()} for op, curves in out.items()}


def fabric_smallest(fabric: str) -> float:
    """The smallest message `fabric` was measured with, in bytes."""
    return min(pts[0][0] for by_nodes in fabric_curves(fabric).values() for pts in by_nodes.values())


def fabric_busbw_GBps(fabric: str, op: str, servers: int, size: float) -> float:
    """nccl-tests' bus bandwidth of `op` on `fabric` (whole servers in the ring) for a
    message of `size` bytes over `servers` servers, interpolated in log size and log servers
    between the measured points and flat beyond them (the reduce-scatter, which has no
    measurement, runs the all-gather's ring). Below the smallest size measured the caller
    adds NCCL's latency (`hardware.measured_collective_seconds`)."""
    curves = fabric_curves(fabric)["all_gather" if op == "reduce_scatter" else op]
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
    elementwise:   the norms, RoPE, SwiGLU and residual adds: "fused" (each tensor streamed
                   once, the bytes `kernels` counts) or "eager" (PyTorch, one kernel per op:
                   `kernels.elementwise_factor` measures how many times more they move)
    cross_entropy: "fused" (one kernel over the logits) or "eager" (op by op in fp32)
    tp_comm_sms:   ((linear, SMs), ...): forward GEMMs that, under TP overlap, share the
                   GPU with a pipelined reduce-scatter holding that many SMs (Transformer
                   Engine's userbuffers, `set_sm_margin`): they run on the SMs left
    p2p_overlap:   the pipeline's sends run beside the compute (Megatron's
                   overlap_p2p_comm); False: batched and waited for (batch_p2p_comm, whose
                   batch_p2p_sync synchronises the device), each on the critical path
    ep_overlap:    expert parallelism's all-to-alls run beside another micro-batch's
                   compute (DeepSeek's DualPipe); False: each is waited for
    ep_comm_sms:   SMs the all-to-all kernels hold while they run beside compute
    dispatch_bytes: bytes per element the EP dispatch sends (None: the activations'; 1:
                   DeepSeek-V3 quantizes to FP8 before dispatch)
    Nothing else: a free factor for what the model does not count would hide what the
    physics misses.
    """

    network: float = NVLINK_BUSBW_FRACTION
    network_inter: float = NIC_BUSBW_FRACTION
    attention: str = "cudnn"
    elementwise: str = "fused"
    cross_entropy: str = "fused"
    p2p_overlap: bool = True
    tp_comm_sms: tuple = ()
    ep_overlap: bool = False
    ep_comm_sms: int = 0
    dispatch_bytes: int | None = None

    @property
    def links(self) -> tuple[float, float]:
        """(inside a server, across servers): what `hardware.axis_seconds` takes."""
        return self.network, self.network_inter


# Llama 3's stack: the paper names no kernels; a Hopper-tuned attention and fused pointwise
# kernels are assumed (`frameworks.LLAMA3` says so).
LLAMA3_EFFICIENCY = Efficiency()


