"""The numbers the collectives chapter states (book/collectives.md), computed once: the ring's
bytes, the alpha-beta model on Llama 3's links (the cost model's cluster), in-network
reduction; what gloo puts on the wire (tests/test_wire.py measures it)."""
from __future__ import annotations

import math

from ...plan.config import ModelConfig
from ...plan.costmodel.constants import LLAMA3_EFFICIENCY as EFF
from ...plan.costmodel.hardware import LLAMA3_CLUSTER as C
from ...plan.costmodel.table4 import TABLE4
from ...plan.formulas.collective_time import all_reduce_cost, all_reduce_time
from ...plan.formulas.collectives import wire_bytes
from ...runtime.wire_meter import HEADER_BYTES, WIRE_GRID, gloo_bytes
from .core import Number, derived, measured

ALPHA_NVLINK = C.nvlink_latency_us * 1e-6      # s per ring step inside a server: NCCL's model
ALPHA_NIC = C.nic_latency_us * 1e-6            # s per ring step across servers: NCCL's model
NVLINK = C.intra_node_GBps * 1e9               # bytes/s per direction per H100
NIC = C.inter_node_GBps * 1e9                  # bytes/s: one 400 Gb/s RoCE link per GPU
# What a ring really gets through each link: the bus bandwidth nccl-tests measure
NVLINK_BUS, NIC_BUS = NVLINK * EFF.network, NIC * EFF.network_inter
BUCKET = 25e6                                  # a gradient bucket (ParallelConfig's default)


def tp_activation_bytes() -> int:
    """One sequence's activations at Table 4 row 1, bf16: what TP all-reduces."""
    return TABLE4[0].seq_len * ModelConfig.preset("llama3-405b").dim * 2


def _ring_factor(n: int) -> float:
    return wire_bytes("all_reduce", n, 2**40) / 2**40


def _links() -> dict[str, Number]:
    act = tp_activation_bytes()
    nv = all_reduce_time(act, C.gpus_per_node, ALPHA_NVLINK, NVLINK_BUS)
    roce = all_reduce_time(act, C.gpus_per_node, ALPHA_NIC, NIC_BUS)
    per_layer = 4                              # Megatron's TP: 2 forward + 2 backward
    small = 2e6
    return {
        "alpha_nvlink_us": measured(C.nvlink_latency_us, "{:g} µs", source="NCCL src/graph/tuning.cc: "
                                    "an NVLink ring step, Simple protocol"),
        "alpha_nic_us": measured(C.nic_latency_us, "{:g} µs", source="NCCL src/graph/tuning.cc: "
                                 "a network ring step, Simple protocol"),
        "link_ratio": derived(NVLINK / NIC, "{:.0f}", source="450 GB/s / 50 GB/s"),
        "tp_act_mb": derived(act / 1e6, "{:.0f} MB", source="8K tokens x 16,384 x 2 bytes"),
        "nvlink_bus_GBps": measured(NVLINK_BUS / 1e9, "{:.0f} GB/s", source="nccl-tests bus bandwidth"),
        "nic_bus_GBps": measured(NIC_BUS / 1e9, "{:.0f} GB/s", source="nccl-tests bus bandwidth"),
        "tp_allreduce_nvlink_ms": derived(nv * 1e3, "{:.2f} ms", source="alpha-beta, TP8 NVLink"),
        "tp_allreduce_roce_ms": derived(roce * 1e3, "{:.1f} ms", source="alpha-beta, 8 GPUs RoCE"),
        "tp_layer_nvlink_ms": derived(per_layer * nv * 1e3, "{:.0f} ms", source="4 x alpha-beta, TP8 NVLink"),
        "tp_layer_roce_ms": derived(per_layer * roce * 1e3, "{:.0f} ms", source="4 x alpha-beta, 8 GPUs RoCE",
                                    quantity="tp_layer_network"),
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
        "nvls_ring_us": Number(t_ring * 1e6, "{:.0f} µs"),
        "nvls_us": Number(t_nvls * 1e6, "{:.0f} µs"),
        "root_factor_64": Number(all_reduce_cost("root", 64, 1.0)[0], "{:.0f}"),
        "tree_steps_16384": Number(2 * (16384 - 1).bit_length(), "{:d}"),
        "ring_steps_16384": Number(2 * (16384 - 1), "{:,}"),
    }


def _wire() -> dict[str, Number]:
    """gloo's bytes over the ring formula's, per op: what tests/test_wire.py measures with
    each rank's write counter on the 2x2x2x2 grid (and fails on if the rule is wrong)."""
    size, n = 2**20, 4           # a dp x cp gradient group of that grid has four ranks
    src = ("gloo's rule (wire.GLOO_WIRE), to which tests/test_wire.py holds the wchar of 16 "
           "gloo ranks around each collective")
    out = {f"wire_{op}": measured(gloo_bytes(op, n, size) / wire_bytes(op, n, size), "{:g}",
                                  source=src)
           for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")}
    return {**out, "wire_ranks": Number(math.prod(WIRE_GRID.values()), "{:d}"), "wire_header_kb":
            Number(HEADER_BYTES // 1000, "{:d} KB", source="wire.HEADER_BYTES")}


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
        **_wire(),
    }
