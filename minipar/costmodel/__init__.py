"""A cost model of one training step: time, memory and bytes on the wire, from first principles.

Chapter "MFU and communication volume". Given a model, a layout (`ParallelConfig`), a
cluster and a batch, `estimate` predicts what a real run would measure: MFU, TFLOP/s per
GPU, step time, memory per GPU and the bytes each GPU sends per step on each axis.
Everything is a pure function; nothing here starts a process or imports torch, so the book,
the widgets and the CLI can ask thousands of what-ifs.

The package, in reading order:

    hardware   the cluster: peak, HBM, the network hierarchy; a group's ring bandwidth
    constants  the three efficiencies (one set for every row of Table 4), the precisions
    workload   the batch and micro-batches; every rule a layout must obey
    memory     what the most loaded GPU holds (parameters, gradients, optimizer, activations)
    wire       the bytes each GPU sends per step, by axis, as CommLog counts them
    time       the step time and MFU: `estimate`
    table4     Llama 3's Table 4 and our prediction of each row
    search     every valid layout of N GPUs, ranked by MFU
    cli        `python -m minipar.costmodel --help`

The formulas themselves (bytes of each collective and axis, the bubble, the stage split,
the memory parts) are `minipar.formulas`', shared with the axis files and their tests, so
that a tiny gloo run's CommLog can be compared with the prediction number for number.
Bytes convention (as `minipar.comm`): what one rank puts on the wire under the ring
algorithm: all-reduce 2(n-1)/n S, all-gather and reduce-scatter (n-1)/n S (S = the full
tensor), send S on the sender.
"""
from __future__ import annotations

from ..formulas import (activation_elements, bubble_fraction, cp_kv_bytes, cp_layer_bytes,
                        dp_bytes, in_flight_microbatches, local_param_count, pp_bytes,
                        rank_layers, stage_layer_counts, tp_cross_entropy_bytes,
                        tp_embedding_bytes, tp_head_bytes, tp_layer_bytes, tp_norm_bytes,
                        zero_padded_numel)
from ..formulas import wire_bytes as ring_bytes
from .cli import build_parser, config_from_args, format_estimate, human_bytes, main
from .constants import (BF16_MIXED, CAUSAL_FRACTION, FP32, LLAMA3_EFFICIENCY, PRECISIONS,
                        RECOMPUTE, TABLE4_BATCH_TOKENS, Efficiency, Precision)
from .hardware import (LLAMA3_CLUSTER, Cluster, axis_group, axis_seconds, dp_group_span,
                       group_bandwidth_GBps)
from .memory import memory_of_rank, memory_per_gpu, param_total_local
from .search import best_configs
from .table4 import TABLE4, Table4Row, table4, table4_fit_counts
from .time import (Estimate, compute_seconds, dp_exposed_seconds, estimate, wire_seconds)
from .wire import comm_bytes_per_gpu
from .workload import Workload, layout_problems, make_workload, workload_problems

__all__ = [
    # hardware and constants
    "Cluster", "LLAMA3_CLUSTER", "group_bandwidth_GBps", "dp_group_span", "axis_group",
    "axis_seconds", "Efficiency", "LLAMA3_EFFICIENCY", "CAUSAL_FRACTION", "Precision",
    "BF16_MIXED", "FP32", "PRECISIONS", "RECOMPUTE", "TABLE4_BATCH_TOKENS",
    # the workload and its rules
    "Workload", "make_workload", "workload_problems", "layout_problems",
    # the formulas, re-exported from minipar.formulas under the cost model's names
    "ring_bytes", "dp_bytes", "zero_padded_numel", "tp_layer_bytes", "tp_embedding_bytes",
    "tp_head_bytes", "tp_norm_bytes", "tp_cross_entropy_bytes", "pp_bytes", "cp_kv_bytes",
    "cp_layer_bytes", "stage_layer_counts", "rank_layers", "local_param_count",
    "activation_elements", "in_flight_microbatches", "bubble_fraction",
    # memory, bytes, time
    "memory_per_gpu", "memory_of_rank", "param_total_local", "comm_bytes_per_gpu",
    "Estimate", "estimate", "compute_seconds", "dp_exposed_seconds", "wire_seconds",
    # Table 4, the search, the CLI
    "Table4Row", "TABLE4", "table4", "table4_fit_counts", "best_configs",
    "build_parser", "config_from_args", "human_bytes", "format_estimate", "main",
]
