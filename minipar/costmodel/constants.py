"""The numbers the cost model does not derive, each with where it comes from.

Chapter "MFU and communication volume". Everything else is counted from the model, the
layout and the GPU's data sheet. These are measurements of the hardware: the kernels a
step is made of, timed on a Hopper GPU by `benchmarks/kernels/measure.py` (its output is
`data/kernels_h200.json`), NCCL's own latency model and the bus bandwidth nccl-tests
report. **None is fitted to an MFU**: the published runs are what the model is judged on
(`evaluate.py`). `python -m minipar.costmodel constants [--json]` lists them all.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TABLE4_BATCH_TOKENS", "Constant", "CONSTANTS", "KERNELS", "KERNELS_FILE", "GEMM_TABLE",
           "Efficiency", "LLAMA3_EFFICIENCY", "CP_ATTENTION", "cp_attention_tflops", "STREAM_FRACTION", "CAUSAL_FRACTION",
           "EAGER_ELEMENTWISE", "FUSED_ELEMENTWISE", "GEMM_CURVE", "NCCL_LATENCY_US",
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


@dataclass(frozen=True)
class Constant:
    """One number the model takes as given: what it is, and who says so."""

    name: str
    value: float
    unit: str
    source: str


MEASURE = "measured here: benchmarks/kernels/measure.py on an NVIDIA H200 (data/kernels_h200.json)"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


# {(m, n, k): seconds} of every GEMM measured
GEMM_TABLE = {(g["m"], g["n"], g["k"]): g["s"] for g in KERNELS["gemms"]}


def _layer_gemm_seconds(spec: dict) -> float:
    """Seconds of the measured GEMMs of one measured block (its 4 linears x 3 products)."""
    tp, h, d, t = spec["tp"], spec["dim"], spec["head_dim"], spec["tokens"]
    q, kv, f = spec["heads"] // tp, max(1, spec["kv"] // tp), spec["ffn"] // tp
    total = 0.0
    for d_in, d_out in ((h, (q + 2 * kv) * d), (q * d, h), (h, 2 * f), (f, h)):
        total += GEMM_TABLE[(t, d_out, d_in)] + GEMM_TABLE[(t, d_in, d_out)] + GEMM_TABLE[(d_in, d_out, t)]
    return total


def _attention_curve(rows: list[dict]) -> tuple[int, list[float], list[float]]:
    """(shortest length measured, log lengths, forward + backward TFLOP/s) of one kernel:
    causal FLOPs (half the square), the backward counted as twice the forward."""
    return (rows[0]["seq"], [math.log(r["seq"]) for r in rows],
            [3 * r["flops_fwd"] / r["fwd_bwd_s"] / 1e12 for r in rows])


ATTENTION_CURVES = {kernel: _attention_curve(rows) for kernel, rows in KERNELS["attention"].items()}


def attention_tflops(kernel: str, block: float) -> float:
    """Measured TFLOP/s of an attention kernel on `block`-token sequences (`ATTENTION_CURVES`),
    interpolated in log(block) between the measured lengths, flat beyond them."""
    shortest, xs, ys = ATTENTION_CURVES[kernel]
    x = math.log(max(block, 1.0))
    if x <= xs[0]:
        return ys[0] * block / shortest                # shorter than measured: launch-bound
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


CP_ATTENTION_TFLOPS = {kernel: _median([r["flops"] / r["fwd_bwd_s"] / 1e12 for r in ranks])
                       for kernel, ranks in CP_ATTENTION["ranks"].items()}


def cp_attention_tflops(kernel: str) -> float:
    """Measured TFLOP/s of one all-gather CP rank's chunked attention (median over ranks)."""
    return CP_ATTENTION_TFLOPS[kernel]


def _elementwise_bytes(spec: dict) -> float:
    """The forward's pointwise bytes of one measured block as `kernels` counts them."""
    h, tp = spec["dim"], spec["tp"]
    kv = max(1, spec["kv"] // tp) * spec["head_dim"]
    per_token = (2 * 2 * h + 2 * 3 * h) + 2 * (spec["heads"] // tp * spec["head_dim"] + kv) + 3 * spec["ffn"] / tp
    return 3 * 2 * per_token * spec["tokens"]


def _pointwise_factor(layers: list[dict], kernel: str = "flash") -> float:
    """Median, over measured blocks, of (block - its GEMMs - its attention) seconds over
    the time `kernels` gives their pointwise bytes at the stream bandwidth: how many times
    the counted bytes an implementation's norms, RoPE, SwiGLU and adds really move."""
    out = []
    for spec in layers:
        attn = 3 * 4 * spec["tokens"] * spec["heads"] // spec["tp"] * spec["seq"] * spec["head_dim"] / 2
        rest = (spec["fwd_bwd_s"] - _layer_gemm_seconds(spec)
                - attn / (attention_tflops(kernel, spec["seq"]) * 1e12))
        out.append(rest / (_elementwise_bytes(spec) / (STREAM_FRACTION * MEASURED_HBM_TBps * 1e12)))
    return _median(out)


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
EAGER_ELEMENTWISE = _pointwise_factor(KERNELS["layers"])
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


def _constants() -> list[Constant]:
    square = max(KERNELS["square"], key=lambda r: 2 * r["m"] ** 3 / r["s"])
    e, w, t0 = GEMM_CURVE
    flash, cudnn = (attention_tflops(k, 8192) for k in ("flash", "cudnn"))
    out = [
        Constant("h100.peak_bf16", 989.4, "TFLOP/s", "NVIDIA H100 SXM5 data sheet (dense bf16)"),
        Constant("h100.hbm", 3.35, "TB/s", "NVIDIA H100 SXM5 data sheet (80 GB HBM3)"),
        Constant("h100.nvlink", 450, "GB/s per direction", "NVIDIA H100 SXM5 data sheet (NVLink 4, 900 GB/s both ways)"),
        Constant("h100.nic", 400, "Gb/s per GPU", "ConnectX-7 NDR / RoCE, one per GPU (Llama 3 paper section 3.3.1)"),
        Constant("gemm.max_fraction", round(2 * square["m"] ** 3 / square["s"] / 989.4e12, 3), "of peak",
                 f"{MEASURE}: the best square bf16 GEMM ({square['m']}^3); stas00/ml-engineering's MAMF finder "
                 "reports 794.5 TFLOP/s (0.803) on an H100 SXM"),
        Constant("gemm.table", len(KERNELS["gemms"]), "shapes", f"{MEASURE}: every GEMM of the published runs' layers"),
        Constant("gemm.curve_e", round(e, 3), "of peak", f"{MEASURE}: kernel curve fitted to the GEMM sweep, for other shapes"),
        Constant("gemm.curve_w", round(w, 2), "x HBM", f"{MEASURE}: the curve's operand-traffic term"),
        Constant("gemm.curve_t0", round(t0 * 1e6, 1), "us", f"{MEASURE}: the curve's fixed cost per GEMM"),
        Constant("attention.flash2_8k", round(flash, 0), "TFLOP/s", f"{MEASURE}: SDPA FlashAttention-2, causal, head dim 128, fwd+bwd"),
        Constant("attention.cudnn_8k", round(cudnn, 0), "TFLOP/s", f"{MEASURE}: SDPA cuDNN attention, causal, head dim 128, fwd+bwd"),
        Constant("attention.flash2_cp_chunk", round(cp_attention_tflops("flash"), 0), "TFLOP/s",
                 f"{MEASURE.replace('measure.py', 'cp_attention.py')}: one CP16 rank at 131K, lower-right causal chunks"),
        Constant("attention.cudnn_cp_chunk", round(cp_attention_tflops("cudnn"), 0), "TFLOP/s",
                 f"{MEASURE.replace('measure.py', 'cp_attention.py')}: one CP16 rank at 131K, lower-right causal chunks"),
        Constant("hbm.stream_fraction", round(STREAM_FRACTION, 3), "of HBM", f"{MEASURE}: a 2 GiB device copy"),
        Constant("elementwise.eager", round(EAGER_ELEMENTWISE, 2), "x counted bytes",
                 f"{MEASURE}: eager PyTorch blocks, (block - GEMMs - attention) over the counted pointwise bytes, median of {len(KERNELS['layers'])}"),
        Constant("elementwise.fused", FUSED_ELEMENTWISE, "x counted bytes",
                 "assumption: a fused kernel streams its tensors once (torch.compile of the 405B block measured below it)"),
        Constant("nccl.base_latency", NCCL_LATENCY_US["base"], "us", "NCCL src/graph/tuning.cc baseLat, Ring/Simple"),
        Constant("nccl.nvlink_step", NCCL_LATENCY_US["nvlink_step"], "us", "NCCL src/graph/tuning.cc hwLat NVLink, Ring/Simple"),
        Constant("nccl.net_step", NCCL_LATENCY_US["net_step"], "us", "NCCL src/graph/tuning.cc hwLat NET, Ring/Simple"),
        Constant("nccl.net_overhead", NCCL_LATENCY_US["net_overhead"], "us", "NCCL src/graph/tuning.cc getNetOverhead x3 (Simple)"),
        Constant("nvlink.busbw_fraction", round(NVLINK_BUSBW_FRACTION, 3), "of link",
                 "nccl-tests all-reduce bus bandwidth on an 8x H100 NVLink server, ~370 of 450 GB/s (NCCL maintainers)"),
        Constant("nic.busbw_fraction", round(NIC_BUSBW_FRACTION, 3), "of link",
                 "nccl-tests bus bandwidth across nodes with one 400 Gb/s NDR NIC per GPU, ~46 of 50 GB/s"),
    ]
    return out


CONSTANTS = {c.name: c for c in _constants()}


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a GPU stores and sends."""

    param_bytes: int = 2        # the weights the matmuls read (and ZeRO all-gathers)
    grad_bytes: int = 4         # gradients as accumulated
    act_bytes: int = 2          # activations, and what TP, CP and PP send
    optimizer_bytes: int = 12   # per parameter: Adam's m and v (+ fp32 master weights)
    reduce_bytes: int = 4       # gradients as data parallelism reduces them


# Llama 3: bf16 weights and activations; "FP32 gradient accumulation during backward
# computation over multiple micro-batches and also reduce-scatter gradients in FP32"
# (section 3.3.2); fp32 master weights and Adam moments.
BF16_MIXED = Precision(param_bytes=2, grad_bytes=4, act_bytes=2, optimizer_bytes=12, reduce_bytes=4)
# minipar on CPU: everything float32, Adam's two moments, no separate master copy.
FP32 = Precision(param_bytes=4, grad_bytes=4, act_bytes=4, optimizer_bytes=8, reduce_bytes=4)
PRECISIONS = {"bf16": BF16_MIXED, "fp32": FP32}
