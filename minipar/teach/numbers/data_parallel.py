"""The numbers the data_parallel chapter states (book/data_parallel.md), computed once:
buckets, ZeRO's bytes, Llama 3's batch and what it caps, and the price of sharded gradients
in the cost model."""
from __future__ import annotations

import dataclasses
from functools import cache

import torch

from ...plan.config import ModelConfig, ParallelConfig
from ...plan.costmodel import LLAMA3_CLUSTER, estimate, frameworks
from ...plan.costmodel.table4 import PAPER_SPLIT
from ...plan.costmodel.constants import TABLE4_BATCH_TOKENS
from ...plan.costmodel.table4 import TABLE4
from ...plan.formulas.memory import zero_bytes_per_param
from ...trainer.parallel.data import FIRST_BUCKET_MB
from .. import replays
from .core import Number, derived, from_replay, in_scenario, paper, predicted, replayed_ms


@cache
def row1_by_zero(zero: int):
    """The cost model's estimate of Table 4 row 1 under Llama 3's stack (as `costmodel.table4`
    makes it: the stack's buckets, dtypes and kernels, the paper's stage split) with ZeRO
    stage `zero`: 2 is the book's reading of the paper (the estimate of `numbers.mfu`'s
    row1_ keys), 1 the what-if of whole gradients."""
    row, model = TABLE4[0], ModelConfig.preset("llama3-405b")
    pc, precision, eff = frameworks.apply(frameworks.LLAMA3, model, row.parallel())
    return estimate(model, dataclasses.replace(pc, zero=zero), LLAMA3_CLUSTER, row.seq_len,
                    global_batch_tokens=TABLE4_BATCH_TOKENS, microbatch_size=1, recompute="none",
                    precision=precision, efficiency=eff, stage_split=PAPER_SPLIT)


def _sharded_gradients() -> dict[str, Number]:
    row = TABLE4[0]
    m = TABLE4_BATCH_TOKENS // row.seq_len // row.dp     # micro-batches per replica per step
    z1, z2 = row1_by_zero(1), row1_by_zero(2)
    dp1, dp2 = z1.comm_bytes_per_gpu["dp"], z2.comm_bytes_per_gpu["dp"]
    # ZeRO-2 (the book's reading, `table4-row1`) is numbers.mfu's row1_ keys: its bytes,
    # exposed time and MFU are stated there once. Here: one reduce-scatter, and the what-if.
    rs = in_scenario({
        # ZeRO-2 adds a reduce-scatter for every micro-batch but the last: what one costs
        "row1_rs_gb": derived((dp2 - dp1) / (m - 1) / 1e9, "{:.1f} GB",
                              source="cost model: (ZeRO-2 bytes - ZeRO-1 bytes) / (m - 1), one "
                                     "GPU's fp32 gradients reduce-scattered once")}, "table4-row1")
    what_if = in_scenario({
        "row1_dp_gb_zero1": derived(dp1 / 1e9, "{:.0f} GB", source="cost model, ZeRO-1"),
        "row1_dp_s_zero1": derived(z1.time_breakdown_s["dp"], "{:.1f} s", source="cost model"),
        "row1_mfu_zero1": predicted(z1.mfu, "llama3", "cost model, ZeRO-1", "derived"),
    }, "row1-zero1", [("row1_dp_s_zero1", "dp_exposed_s"), ("row1_dp_gb_zero1", "dp_bytes_step")])
    return {
        "row1_microbatches": derived(m, source="2,048 sequences / DP 64"),
        **rs, **what_if,
        "row1_mfu_paper": paper(row.mfu, "{:.0%}", source="Table 4"),
    }


def _batch() -> dict[str, Number]:
    row1, row2 = TABLE4[0], TABLE4[1]
    seqs = TABLE4_BATCH_TOKENS // row1.seq_len
    return {
        "dp_cap_with_pp": derived(seqs // row1.pp, source="2,048 sequences / 16 micro-batches"),
        "row2_microbatches": derived(seqs // row2.dp, source="2,048 sequences / DP 128"),
        "batch_initial": paper("4M", "{}", source="Section 3.4.1"),
        "seq_initial": paper(4096, source="Section 3.4.1"),
        "batch_middle": paper("8M", "{}", source="Section 3.4.1"),
        "batch_switch_1": paper("252M", "{}", source="Section 3.4.1"),
        "batch_switch_2": paper("2.87T", "{}", source="Section 3.4.1"),
    }


def ring_sum_error(n: int, dtype: torch.dtype, numel: int = 2**14, seed: int = 0) -> float:
    """Relative (L2) error of summing n ranks' gradients hop by hop, as a ring does, with the
    gradients and every partial sum in `dtype`, against the exact (float64) sum. The
    gradients: independent normal values, one scale for all ranks."""
    g = torch.Generator().manual_seed(seed)
    grads = torch.randn(n, numel, generator=g, dtype=torch.float64) * 1e-3
    exact = grads.sum(0)
    acc = grads[0].to(dtype)
    for k in range(1, n):
        acc = acc + grads[k].to(dtype)              # the addition happens in `dtype`
    return ((acc.double() - exact).norm() / exact.norm()).item()


def _precision() -> dict[str, Number]:
    n = TABLE4[1].dp
    return {
        "bf16_error": Number(ring_sum_error(n, torch.bfloat16), "{:.1%}"),
        "fp32_error": Number(ring_sum_error(n, torch.float32), "{:.0e}"),
        "bf16_error_8": Number(ring_sum_error(8, torch.bfloat16), "{:.1%}"),
    }


def _replayed() -> dict[str, Number]:
    """Bucketed and naive DP replayed at Llama 3 8B's shapes on H100s (`teach.replays`)."""
    src = "replays.replayed('{}'), rank mean"
    bucketed, naive = replays.replayed("data_parallel"), replays.replayed("data_parallel_naive")
    # Not stated: the bucketed run's exposed time, a few ms or none, as the last layer's
    # time is split (the figure shows it).
    return {
        "replay_bucketed_hidden": replayed_ms(bucketed.hidden_s["dp"], src.format("data_parallel")),
        "replay_naive_exposed": replayed_ms(naive.exposed_s["dp"], src.format("data_parallel_naive")),
        "replay_naive_slower": from_replay(naive.step_time_s / bucketed.step_time_s - 1, "{:.0%}",
                                           "replayed step times, naive / bucketed - 1"),
    }


def numbers() -> dict[str, Number]:
    pc = ParallelConfig()
    return {
        "bucket_mb": Number(pc.bucket_mb, "{:g} MB"),
        "first_bucket_mb": Number(FIRST_BUCKET_MB, "{:g} MB"),
        "mixed_bytes": Number(sum(zero_bytes_per_param(0, 1).values()), "{:g}"),
        "optimizer_bytes": Number(zero_bytes_per_param(0, 1)["optimizer"], "{:g}"),
        **_batch(),
        **_precision(),
        **_sharded_gradients(),
        **_replayed(),
    }
