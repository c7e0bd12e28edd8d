"""The numbers the memory chapter states (book/memory.md), computed once.

Two kinds: `tiny`'s per-layer accounting (formulas.layer_saved_breakdown and friends), and
Llama 3 405B's budget per GPU for each row of Table 4 (costmodel.memory with Llama 3's
mixed precision), each with its evidence: which bytes per parameter the paper states and
which the book assumes, and what the 80 GB of an H100 are.
"""
from __future__ import annotations

import math

import torch

from ...plan.config import ModelConfig
from ...plan.config import TrainConfig
from ...plan.costmodel.memory import fullest_stage, memory_of_rank
from ...plan.costmodel.table4 import table4
from ...plan.flops import layer_param_count, param_count
from ...plan.formulas.memory import activation_elements, layer_saved_elements
from ...plan.formulas.memory import in_flight_chunks
from ...plan.memory import BF16_MIXED, FP32, layer_bytes
from ...plan.schedules import stage_layer_counts
from .core import Number, assumed, derived, measured, paper
from .llama3 import HBM_BYTES, NVIDIA_SMI_MIB

GIB = 2**30
HBM_GIB = NVIDIA_SMI_MIB / 1024  # the book's one HBM figure: 79.6 GiB = 85.5 GB (the paper's
#                                  "80GB HBM3" is the product's name; issue 40, item 24)
RECOMPUTE_SEQ = 128            # the notebook's recompute run: tiny, 8 x 128 tokens


def recompute_flop_ratio(model: ModelConfig, seq_len: int, mode: str) -> float:
    """FLOPs of a training step with recomputation over FLOPs without (PaLM's count:
    6N + 12 L h s per token). Full recompute runs every block's forward again (2 FLOPs per
    weight and token, plus the attention core's 4 L h s); selective only the attention core."""
    L, h = model.n_layers, model.dim
    train = 6 * param_count(model, embeddings=False) + 12 * L * h * seq_len
    core = 4 * L * h * seq_len
    extra = {"none": 0, "selective": core,
             "full": 2 * L * layer_param_count(model) + core}[mode]
    return 1 + extra / train


def budgets() -> list[dict]:
    """For each Table 4 row, the fullest GPU's bytes with whole (ZeRO-1) and sharded
    (ZeRO-2) fp32 gradients: [{"row", "stage", 1: {part: bytes}, 2: {part: bytes},
    "layer_mb": layer-micro-batches in flight on that stage, "per_layer_mb": bytes of one}]."""
    model = ModelConfig.preset("llama3-405b")
    out = []
    for row, e in table4():
        w = e.workload
        entry = {"row": row}
        for zero in (1, 2):
            pc = e.parallel.replace(zero=zero)
            entry["stage"] = stage = fullest_stage(model, pc, w, BF16_MIXED)
            entry[zero] = memory_of_rank(model, pc, w, BF16_MIXED, stage)
        pc = e.parallel
        flight = in_flight_chunks(pc.schedule, pc.pp, w.microbatches(pc), stage, pc.virtual_stages)
        layers = stage_layer_counts(model.n_layers, pc.pp * pc.virtual_stages)
        entry["layer_mb"] = sum(n * layers[c * pc.pp + stage] for c, n in enumerate(flight))
        entry["per_layer_mb"] = layer_bytes(model, pc, BF16_MIXED, "none") * w.tokens_per_microbatch(pc)
        entry["first_chunk_flight"] = in_flight_chunks(pc.schedule, pc.pp, w.microbatches(pc), 0,
                                                       pc.virtual_stages)[0]
        out.append(entry)
    return out


def _tiny() -> dict[str, Number]:
    tiny = ModelConfig.preset("tiny")
    none, full = layer_saved_elements(tiny), layer_saved_elements(tiny, recompute="full")
    fused = activation_elements(tiny, 1, False, "none")
    run = TrainConfig()
    return {
        "tiny_dim": Number(tiny.dim), "tiny_heads": Number(tiny.n_heads),
        "tiny_kv": Number(tiny.n_kv_heads * tiny.head_dim), "tiny_ffn": Number(tiny.ffn_dim),
        "tiny_layer_elements": Number(none, "{:,.0f}", source="formulas.memory.layer_saved_elements"),
        "tiny_fused_elements": Number(fused, "{:,.0f}", source="formulas.memory.activation_elements"),
        "fused_short": Number(1 - fused / none, "{:.0%}"),
        "tiny_lse_elements": Number(tiny.n_heads),
        "tiny_full_elements": Number(full, "{:,.0f}"),
        "full_saving": Number(none / full, "{:.0f}"),
        "full_extra_flops": Number(recompute_flop_ratio(tiny, RECOMPUTE_SEQ, "full") - 1, "{:.0%}"),
        "selective_extra_flops": Number(recompute_flop_ratio(tiny, RECOMPUTE_SEQ, "selective") - 1,
                                        "{:.0%}"),
        "recompute_seq": Number(RECOMPUTE_SEQ),
        "grid_batch": Number(run.global_batch), "grid_seq": Number(run.seq_len),
        "fp32_bytes": Number(FP32.param_bytes), "fp32_adam_bytes": Number(FP32.optimizer_bytes),
    }


def bf16_stall() -> int:
    """Add 1.0 to a bf16 running sum until it stops growing: where bf16 stops counting."""
    total = torch.zeros((), dtype=torch.bfloat16)
    while total + 1 != total:
        total = total + 1
    return int(total.item())


def _precision() -> dict[str, Number]:
    """Llama 3's mixed precision, byte by byte per parameter."""
    p = BF16_MIXED
    per_param = p.state_bytes_per_param
    n = param_count(ModelConfig.preset("llama3-405b"))
    return {
        "bf16_param_bytes": assumed(p.param_bytes, source="bf16 weights for the matmuls: the "
                                    "paper trains in BF16 but does not list its bytes"),
        "grad_bytes": paper(p.grad_bytes, source="Section 3.3.2: FP32 gradient accumulation "
                            "and reduce-scatter in FP32"),
        "optimizer_bytes": assumed(p.optimizer_bytes, source="fp32 master weights and Adam's "
                                   "two fp32 moments: the usual mixed precision; not in the paper"),
        "bytes_per_param": derived(per_param, source="2 + 4 + 12", quantity="state_bytes_per_param"),
        "zero_paper_bytes": Number(2 + 2 + 12, source="ZeRO's accounting: fp16 weights and "
                                   "gradients, fp32 master weights, m, v"),
        "bf16_stall": Number(bf16_stall(), source="torch, bfloat16 addition"),
        "bf16_mantissa_bits": Number(round(-math.log2(torch.finfo(torch.bfloat16).eps)),
                                     source="bfloat16's stored mantissa bits: eps = 2^-7"),
        "unsharded_tb": derived(per_param * n / 1e12, "{:.1f} TB", quantity="state_tb",
                                source="18 bytes x 405B parameters, before any sharding"),
        "fp8_scale_bound": paper(1200, source="Section 6.2: dynamic scaling factors upper-bounded"),
    }


def _budget() -> dict[str, Number]:
    rows = budgets()
    out = {
        "hbm_gib": measured(HBM_GIB, "{:.1f} GiB", source="the one HBM figure of the book: "
                            "nvidia-smi's 81,559 MiB on an H100 SXM 80GB, in GiB"),
        "hbm_gb": measured(HBM_BYTES / 1e9, "{:.1f} GB", source="nvidia-smi's 81,559 MiB in decimal GB"),
        "nvidia_smi_mib": measured(NVIDIA_SMI_MIB, "{:,} MiB", source="nvidia-smi on an H100 SXM 80GB"),
        "fullest_stage": derived(rows[0]["stage"], "{}", source="costmodel.memory.fullest_stage"),
        "first_chunk_flight": derived(rows[0]["first_chunk_flight"], source="formulas.memory.in_flight_chunks"),
        "zero1_grads_gb": derived(rows[0][1]["grads"] / 1e9, "{:.1f} GB",
                                  source="costmodel.memory: fp32 gradients, whole"),
    }
    for i, r in enumerate(rows, 1):
        for zero in (1, 2):
            out[f"row{i}_zero{zero}_gb"] = derived(r[zero]["total"] / 1e9, "{:.1f} GB",
                                                   source="costmodel.memory.memory_of_rank")
        out[f"row{i}_zero2_gib"] = derived(r[2]["total"] / GIB, "{:.1f} GiB",
                                           source="costmodel.memory.memory_of_rank")
        out[f"row{i}_spare_gib"] = derived(HBM_GIB - r[2]["total"] / GIB, "{:.1f} GiB",
                                           source="nvidia-smi's 79.6 GiB minus the ZeRO-2 total")
        out[f"row{i}_acts_gb"] = derived(r[2]["activations"] / 1e9, "{:.0f} GB",
                                         source="costmodel.memory.activation_bytes")
        out[f"row{i}_layer_mb"] = derived(r["layer_mb"], source="formulas.memory.in_flight_chunks")
        out[f"row{i}_per_layer_mb"] = derived(r["per_layer_mb"] / 1e6, "{:.0f} MB",
                                              source="Korthikanti's count x 8K tokens, bf16")
    return out


def numbers() -> dict[str, Number]:
    return {**_tiny(), **_precision(), **_budget()}
