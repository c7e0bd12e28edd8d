"""A cost model of one training step: time, memory and bytes on the wire, from first principles.

Chapter "MFU and communication volume". Given a model, a layout (`ParallelConfig`), a
cluster and a batch, `estimate` predicts what a real run would measure: MFU, TFLOP/s per
GPU, step time, memory per GPU and the bytes each GPU sends per step on each axis.
Everything is a pure function; nothing here starts a process or imports torch, so the book,
the widgets and the CLI can ask thousands of what-ifs.

The package, in reading order:

    hardware   the cluster: peak, HBM, the network hierarchy; a collective's alpha-beta time
    gpus       clusters of a data sheet's GPUs (plan/datasheets.py) by name (--gpu h100), any field overridable
    constants  the measured constants (data/kernels_h200.json), the stacks' efficiencies, the precisions
    kernels    compute of a micro-batch: measured GEMMs and attention, memory-bound by bytes
    catalog    every constant the model takes as given, with its source (`... constants`)
    frameworks what each software stack does (llama3, megatron, nemo, nanotron, deepspeed,
               torchtitan)
    workload   the batch and micro-batches; every rule a layout must obey
    scenario   one step as one frozen value (model, cluster, layout, stack, batch), checked
    memory     what the most loaded GPU holds (parameters, gradients, optimizer, activations)
    wire       the bytes each GPU sends per step, by axis, as CommLog counts them
    exposure   what each axis's communication costs once overlap is counted
    time       the step time and MFU: `estimate`
    table4     Llama 3's Table 4 and our prediction of each row
    calibration  the published runs (data/published_runs.csv) as the model's objects
    evaluate   `python -m minipar.costmodel.evaluate`: prediction, publication, error
    search     the one enumerator of layouts (`layouts`); every valid one of N GPUs, ranked by MFU
    defaults   layout-dependent defaults, chosen for the layout given
    planner    the pruned exhaustive search, limiting terms, the binding constraint
    cli        `python -m minipar.costmodel --help`, `... plan --help`

The formulas themselves (bytes of each collective and axis, the bubble, the stage split,
the memory parts) are `minipar.plan.formulas`', shared with the axis files and their tests, so
that a tiny gloo run's CommLog can be compared with the prediction number for number.
Bytes convention (as `minipar.trainer.comm`): what one rank puts on the wire under the ring
algorithm: all-reduce 2(n-1)/n S, all-gather and reduce-scatter (n-1)/n S (S = the full
tensor), send S on the sender.
"""
from __future__ import annotations

from .band import mfu_band
from .calibration import PLAYBOOK_CLUSTER, PLAYBOOK_MODELS, PublishedRun, nemo_runs, published_runs
from .catalog import Constant, all_constants
from .cli import build_parser, config_from_args, format_estimate, human_bytes, main
from .constants import CAUSAL_FRACTION, LLAMA3_EFFICIENCY, TABLE4_BATCH_TOKENS, Efficiency
from .frameworks import FRAMEWORKS, Framework, framework
from .gpus import GPU_NAMES, GPU_SHEETS, gpu_cluster
from .hardware import (FABRICS, LLAMA3_CLUSTER, Cluster, axis_group, axis_seconds,
                       dp_group_span, group_bandwidth_GBps)
from .kernels import attention_seconds, matmul_seconds
from .memory import memory_of_rank, memory_per_gpu, param_total_local
from .planner import Plan, binding_constraint, limiting_term, plan
from .scenario import Scenario, scenario
from .search import best_configs
from .table4 import TABLE4, Table4Row, table4
from .time import Estimate, compute_seconds, dp_exposed_seconds, estimate, step_estimate, wire_seconds
from .wire import comm_bytes_per_gpu
from .workload import Workload, layout_problems, make_workload, workload_problems
from ..flops import local_param_count
from ..formulas.collectives import wire_bytes as ring_bytes
from ..formulas.context_parallel import cp_kv_bytes, cp_layer_bytes
from ..formulas.data_parallel import dp_bytes, zero_padded_numel
from ..formulas.memory import activation_elements, in_flight_microbatches
from ..formulas.pipeline_parallel import bubble_fraction, pp_bytes
from ..formulas.tensor_parallel import (tp_cross_entropy_bytes, tp_embedding_bytes,
                                        tp_head_bytes, tp_layer_bytes, tp_norm_bytes)
from ..memory import BF16_MIXED, FP32, PRECISIONS, Precision
from ..schedules import rank_layers, stage_layer_counts

__all__ = [
    # hardware and constants
    "Cluster", "LLAMA3_CLUSTER", "FABRICS", "group_bandwidth_GBps", "dp_group_span", "axis_group",
    "axis_seconds", "Efficiency", "LLAMA3_EFFICIENCY", "CAUSAL_FRACTION", "Precision",
    "BF16_MIXED", "FP32", "PRECISIONS", "TABLE4_BATCH_TOKENS",
    # the workload and its rules
    "Workload", "make_workload", "workload_problems", "layout_problems",
    # the formulas, re-exported from minipar.plan.formulas under the cost model's names
    "ring_bytes", "dp_bytes", "zero_padded_numel", "tp_layer_bytes", "tp_embedding_bytes",
    "tp_head_bytes", "tp_norm_bytes", "tp_cross_entropy_bytes", "pp_bytes", "cp_kv_bytes",
    "cp_layer_bytes", "stage_layer_counts", "rank_layers", "local_param_count",
    "activation_elements", "in_flight_microbatches", "bubble_fraction",
    # memory, bytes, time
    "memory_per_gpu", "memory_of_rank", "param_total_local", "comm_bytes_per_gpu",
    "Scenario", "scenario", "Estimate", "estimate", "step_estimate", "compute_seconds",
    "dp_exposed_seconds", "wire_seconds",
    # Table 4, the search, the CLI
    "Table4Row", "TABLE4", "table4", "best_configs", "Constant", "all_constants",
    "Framework", "FRAMEWORKS", "framework",
    # GPUs, kernels, the calibration runs, the planner
    "GPU_NAMES", "GPU_SHEETS", "gpu_cluster", "matmul_seconds", "attention_seconds",
    "PLAYBOOK_CLUSTER", "PLAYBOOK_MODELS", "PublishedRun", "published_runs", "nemo_runs", "mfu_band",
    "Plan", "plan", "limiting_term",
    "binding_constraint",
    "build_parser", "config_from_args", "human_bytes", "format_estimate", "main",
]
