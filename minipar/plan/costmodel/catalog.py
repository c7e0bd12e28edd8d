"""Every number the cost model takes as given, listed with who says so.

Chapter "MFU and communication volume". `python -m minipar.costmodel constants [--json]`
prints this list: the data sheets' numbers, NCCL's latency model, nccl-tests' bus
bandwidths and what `benchmarks/kernels/` measured on a GPU (`constants.py` reads the
measurements; `kernels.py` derives the pointwise factor from them with its own formulas).
None is fitted to an MFU.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .constants import (FUSED_ELEMENTWISE, MEASURED_PEAK_TFLOPS, NCCL_LATENCY_US,
                        NIC_BUSBW_FRACTION, NVLINK_BUSBW_FRACTION, attention_tflops,
                        cp_attention_tflops, fabric_busbw_GBps, fabric_curves, gemm_curve,
                        measurements, stream_fraction)
from .kernels import elementwise_factor
from ..datasheets import H100

EFA = ("nccl-tests on AWS p5.48xlarge (EFA, 400 Gb/s per GPU), whole servers, out-of-place busbw: "
       "github.com/crazyguitar/aws-gpu-communication-benchmark data/ (CC BY 4.0), in data/nccl_tests_efa_p5.csv")
MEASURE = "measured here: benchmarks/kernels/measure.py on an NVIDIA H200 (data/kernels_h200.json)"


@dataclass(frozen=True)
class Constant:
    """One number the model takes as given: what it is, and who says so."""

    name: str
    value: float
    unit: str
    source: str


def _constants() -> list[Constant]:
    """The data sheets', NCCL's, nccl-tests' and the kernel measurements' numbers, in order."""
    kernels = measurements()
    square = max(kernels["square"], key=lambda r: 2 * r["m"] ** 3 / r["s"])
    e, w, t0 = gemm_curve()
    flash, cudnn = (attention_tflops(k, 8192) for k in ("flash", "cudnn"))
    out = [
        Constant("h100.peak_bf16", H100.bf16_tflops, "TFLOP/s", "NVIDIA H100 SXM5 data sheet (dense bf16)"),
        Constant("h100.hbm", H100.hbm_TBps, "TB/s", "NVIDIA H100 SXM5 data sheet (80 GB HBM3)"),
        Constant("h100.nvlink", H100.nvlink_GBps, "GB/s per direction", "NVIDIA H100 SXM5 data sheet (NVLink 4, 900 GB/s both ways)"),
        Constant("h100.nic", H100.nic_Gbps, "Gb/s per GPU", "ConnectX-7 NDR / RoCE, one per GPU (Llama 3 paper section 3.3.1)"),
        Constant("gemm.max_fraction", round(2 * square["m"] ** 3 / square["s"] / (MEASURED_PEAK_TFLOPS * 1e12), 3), "of peak",
                 f"{MEASURE}: the best square bf16 GEMM ({square['m']}^3); stas00/ml-engineering's MAMF finder "
                 "reports 794.5 TFLOP/s (0.803) on an H100 SXM"),
        Constant("gemm.table", len(kernels["gemms"]), "shapes", f"{MEASURE}: every GEMM of the published runs' layers"),
        Constant("gemm.curve_e", round(e, 3), "of peak", f"{MEASURE}: kernel curve fitted to the GEMM sweep, for other shapes"),
        Constant("gemm.curve_w", round(w, 2), "x HBM", f"{MEASURE}: the curve's operand-traffic term"),
        Constant("gemm.curve_t0", round(t0 * 1e6, 1), "us", f"{MEASURE}: the curve's fixed cost per GEMM"),
        Constant("attention.flash2_8k", round(flash, 0), "TFLOP/s", f"{MEASURE}: SDPA FlashAttention-2, causal, head dim 128, fwd+bwd"),
        Constant("attention.cudnn_8k", round(cudnn, 0), "TFLOP/s", f"{MEASURE}: SDPA cuDNN attention, causal, head dim 128, fwd+bwd"),
        Constant("attention.flash2_cp_chunk", round(cp_attention_tflops("flash"), 0), "TFLOP/s",
                 f"{MEASURE.replace('measure.py', 'cp_attention.py')}: one CP16 rank at 131K, lower-right causal chunks"),
        Constant("attention.cudnn_cp_chunk", round(cp_attention_tflops("cudnn"), 0), "TFLOP/s",
                 f"{MEASURE.replace('measure.py', 'cp_attention.py')}: one CP16 rank at 131K, lower-right causal chunks"),
        Constant("hbm.stream_fraction", round(stream_fraction(), 3), "of HBM", f"{MEASURE}: a 2 GiB device copy"),
        Constant("elementwise.eager", round(elementwise_factor("eager"), 2), "x counted bytes",
                 f"{MEASURE}: eager PyTorch blocks, (block - GEMMs - attention) over the counted pointwise bytes, median of {len(kernels['layers'])}"),
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
        Constant("efa.nccl_tests", sum(len(pts) for curves in fabric_curves("efa").values() for pts in curves.values()),
                 "points", f"{EFA}: all_reduce and all_gather, 2 to 32 servers, 32 MiB to 8 GiB"),
        Constant("efa.all_reduce_32x8GiB", round(fabric_busbw_GBps("efa", "all_reduce", 32, 8 * 2**30) / 400, 3),
                 "of 8 NICs", f"{EFA}: all_reduce over 32 servers, 8 GiB"),
        Constant("efa.all_gather_32x32MiB", round(fabric_busbw_GBps("efa", "all_gather", 32, 32 * 2**20) / 400, 3),
                 "of 8 NICs", f"{EFA}: all_gather over 32 servers, 32 MiB (a DDP bucket's size)"),
    ]
    return out


@functools.cache
def all_constants() -> dict[str, Constant]:
    """{name: `Constant`} of every number the model takes as given (read on first use)."""
    return {c.name: c for c in _constants()}
