"""The GPU data sheets the cost model knows, by name: `--gpu h100`, any field overridable.

Chapter "Four dimensions at once" (choosing a layout starts from the hardware). One row per
GPU: what it computes (dense bf16 FLOP/s), how fast it reads its memory (HBM bandwidth), how
much memory it has, how fast it talks inside a server (NVLink, per direction) and across
servers (one NIC per GPU), and how many GPUs share a server. Nothing here is fitted: these
are the vendors' numbers, and the measured constants (`constants`) say what fraction of
them software reaches.
"""
from __future__ import annotations

from dataclasses import replace

from ..config import ConfigError, unknown
from .hardware import LLAMA3_CLUSTER, Cluster

# name: (peak dense bf16 TFLOP/s, HBM TB/s, HBM GB (1e9 bytes: an "80 GB" card holds
#        80 GiB = 85.9 GB), NVLink GB/s per direction, NIC Gb/s per GPU, GPUs per server)
GPU_SHEETS: dict[str, tuple[float, float, float, float, float, int]] = {
    "h100": (989.0, 3.35, 85.9, 450.0, 400.0, 8),     # H100 SXM5, NVLink 4, ConnectX-7
    "h200": (989.0, 4.8, 141.0, 450.0, 400.0, 8),     # same die, HBM3e
    "a100": (312.0, 2.039, 85.9, 300.0, 200.0, 8),    # A100 SXM4 80GB, NVLink 3, HDR
    "b200": (2250.0, 8.0, 180.0, 900.0, 400.0, 8),    # HGX B200, NVLink 5
}
GPU_NAMES = tuple(GPU_SHEETS)


def gpu_cluster(gpu: str = "h100", **overrides) -> Cluster:
    """A `Cluster` of `gpu`s wired like Llama 3's (racks of two servers, 3,072-GPU pods,
    1:7 between pods), with any field replaced by `overrides` (None values ignored)."""
    key = gpu.lower().replace(" ", "").replace("-sxm", "")
    if key not in GPU_SHEETS:
        raise ConfigError(unknown("--gpu", gpu, GPU_NAMES))
    peak, hbm_tbps, hbm_gb, nvlink, nic, per_node = GPU_SHEETS[key]
    sheet = dict(name=key, peak_tflops=peak, hbm_TBps=hbm_tbps, hbm_gb=hbm_gb,
                 intra_node_GBps=nvlink, inter_node_Gbps=nic, gpus_per_node=per_node,
                 gpus_per_rack=2 * per_node)
    sheet.update({k: v for k, v in overrides.items() if v is not None})
    extra = set(sheet) - set(Cluster.__dataclass_fields__)
    if extra:
        raise ConfigError(f"unknown hardware field(s) {sorted(extra)}")
    return replace(LLAMA3_CLUSTER, **sheet)
