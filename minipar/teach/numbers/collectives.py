"""The numbers the collectives chapter states (book/collectives.md), computed once: the ring's
bytes, the alpha-beta model on Llama 3's links (the cost model's cluster), in-network
reduction."""
from __future__ import annotations

from ...config import ModelConfig
from ...costmodel.hardware import LLAMA3_CLUSTER as C
from ...costmodel.table4 import TABLE4
from ...formulas.collective_time import all_reduce_cost, all_reduce_time
from ...formulas.collectives import wire_bytes
from .core import Number, derived, measured

ALPHA_NVLINK = C.nvlink_latency_us * 1e-6      # s per ring step inside a server: NCCL's model
ALPHA_NIC = C.nic_latency_us * 1e-6            # s per ring step across servers: NCCL's model
NVLINK = C.intra_node_GBps * 1e9               # bytes/s per direction per H100
NIC = C.inter_node_GBps * 1e9                  # bytes/s: one 400 Gb/s RoCE link per GPU
BUCKET = 25e6                                  # a gradient bucket (ParallelConfig's default)


def tp_activation_bytes() -> int:
    """One sequence's activations at Table 4 row 1, bf16: what TP all-reduces."""
    return TABLE4[0].seq_len * ModelConfig.preset("llama3-405b").dim * 2


def _ring_factor(n: int) -> float:
    return wire_bytes("all_reduce", n, 2**40) / 2**40


def _links() -> dict[str, Number]:
    act = tp_activation_bytes()
    nv = all_reduce_time(act, C.gpus_per_node, ALPHA_NVLINK, NVLINK)
    roce = all_reduce_time(act, C.gpus_per_node, ALPHA_NIC, NIC)
    small = 2e6
    return {
        "alpha_nvlink_us": measured(C.nvlink_latency_us, "{:g} µs", source="NCCL src/graph/tuning.cc: "
                                    "an NVLink ring step, Simple protocol"),
        "alpha_nic_us": measured(C.nic_latency_us, "{:g} µs", source="NCCL src/graph/tuning.cc: "
                                 "a network ring step, Simple protocol"),
        "link_ratio": derived(NVLINK / NIC, "{:.0f}", source="450 GB/s / 50 GB/s"),
        "tp_act_mb": derived(act / 1e6, "{:.0f} MB", source="8K tokens x 16,384 x 2 bytes"),
        "tp_allreduce_nvlink_ms": derived(nv * 1e3, "{:.2f} ms", source="alpha-beta, TP8 NVLink"),
        "tp_allreduce_roce_ms": derived(roce * 1e3, "{:.1f} ms", source="alpha-beta, 8 GPUs RoCE"),
        "tp_roce_over_nvlink": derived(roce / nv, "{:.0f}", source="the two times above"),
        "crossover_mb_64": derived(64 * ALPHA_NIC * NIC / 1e6, "{:.0f} MB", source="n alpha B"),
        "crossover_mb_128": derived(128 * ALPHA_NIC * NIC / 1e6, "{:.0f} MB", source="n alpha B"),
        "crossover_mb_nvlink": derived(C.gpus_per_node * ALPHA_NVLINK * NVLINK / 1e6, "{:.1f} MB",
                                       source="n alpha B, 8 GPUs NVLink"),
        "small_bucket_mb": Number(small / 1e6, "{:.0f} MB"),
        "small_bucket_latency_share": derived(
            2 * 63 * ALPHA_NIC / all_reduce_time(small, 64, ALPHA_NIC, NIC), "{:.0%}",
            source="latency / total, 2 MB over 64 GPUs"),
    }


def _in_network() -> dict[str, Number]:
    n = C.gpus_per_node
    ring, t_ring = all_reduce_cost("ring", n, BUCKET, ALPHA_NVLINK, NVLINK)
    nvls, t_nvls = all_reduce_cost("in-network", n, BUCKET, ALPHA_NVLINK, NVLINK)
    return {
        "nvls_ring_factor": Number(ring / BUCKET, "{:.2f}"),
        "nvls_saving": Number(ring / nvls, "{:.2f}"),
        "nvls_bucket_mb": Number(BUCKET / 1e6, "{:.0f} MB"),
        "nvls_ring_us": Number(t_ring * 1e6, "{:.0f} µs"),
        "nvls_us": Number(t_nvls * 1e6, "{:.0f} µs"),
        "root_factor_64": Number(all_reduce_cost("root", 64, 1.0)[0], "{:.0f}"),
        "tree_steps_16384": Number(2 * (16384 - 1).bit_length(), "{:d}"),
        "ring_steps_16384": Number(2 * (16384 - 1), "{:,}"),
    }


def numbers() -> dict[str, Number]:
    return {
        "ring_2": Number(_ring_factor(2), "{:g}"),
        "ring_4": Number(_ring_factor(4), "{:g}"),
        "ring_8": Number(_ring_factor(8), "{:g}"),
        "ring_16": Number(_ring_factor(16), "{:.3f}"),
        "ring_16384": Number(_ring_factor(16384), "{:.4f}"),
        "small_n": Number(16),
        "notebook_ranks": Number(4, "{:d}"),
        **_links(),
        **_in_network(),
    }
