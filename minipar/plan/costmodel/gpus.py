"""The GPUs the cost model can wire into a cluster, by name: `--gpu h100`, any field overridable.

Chapter "Four dimensions at once" (choosing a layout starts from the hardware). Each is a row
of the one table of data sheets (`minipar.plan.datasheets`) that gives a server's wiring:
what a GPU computes (dense bf16 FLOP/s), how fast it reads its memory and how much it has,
how fast it talks inside a server (NVLink, per direction) and across servers (one NIC per
GPU), and how many GPUs share a server. Nothing here is fitted: these are the vendors'
numbers, and the measured constants (`constants`) say what fraction of them software reaches.
"""
from __future__ import annotations

from dataclasses import replace

from ..config import ConfigError, unknown
from .hardware import LLAMA3_CLUSTER, Cluster
from ..datasheets import SHEETS

GPU_SHEETS = {key.lower(): s for key, s in SHEETS.items() if s.gpus_per_server}   # servers only
GPU_NAMES = tuple(GPU_SHEETS)


def gpu_cluster(gpu: str = "h100", **overrides) -> Cluster:
    """A `Cluster` of `gpu`s wired like Llama 3's (racks of two servers, 3,072-GPU pods,
    1:7 between pods), with any field replaced by `overrides` (None values ignored)."""
    key = gpu.lower().replace(" ", "").replace("-sxm", "")
    if key not in GPU_SHEETS:
        raise ConfigError(unknown("--gpu", gpu, GPU_NAMES))
    s = GPU_SHEETS[key]
    sheet = dict(name=key, peak_tflops=s.bf16_tflops, hbm_TBps=s.hbm_TBps, hbm_gb=s.hbm_gb,
                 intra_node_GBps=s.nvlink_GBps, inter_node_Gbps=s.nic_Gbps,
                 gpus_per_node=s.gpus_per_server, gpus_per_rack=2 * s.gpus_per_server,
                 sms=s.sms)
    sheet.update({k: v for k, v in overrides.items() if v is not None})
    extra = set(sheet) - set(Cluster.__dataclass_fields__)
    if extra:
        raise ConfigError(f"unknown hardware field(s) {sorted(extra)}")
    return replace(LLAMA3_CLUSTER, **sheet)
