"""Llama 3's Table 4: the three published layouts of 405B, and our prediction of each.

Chapter "MFU and communication volume" (and "The Llama 3 case study"). The model is judged
here: the hardware's measured constants and the paper's own choices (`frameworks.LLAMA3`),
nothing fitted to these rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import ModelConfig, ParallelConfig
from . import frameworks
from .constants import TABLE4_BATCH_TOKENS
from .hardware import LLAMA3_CLUSTER
from .time import Estimate, estimate


@dataclass(frozen=True)
class Table4Row:
    gpus: int
    tp: int
    cp: int
    pp: int
    dp: int
    seq_len: int
    tflops_per_gpu: float      # published
    mfu: float                 # published

    def parallel(self) -> ParallelConfig:
        """The layout as we read the paper: interleaved 1F1B with one layer per chunk
        (v = 128 / 16 = 8: "the first model chunk on the first stage has only the
        embedding"), sequence parallelism, all-gather context parallelism. What FSDP does
        (fp32 gradients sharded and reduce-scattered per micro-batch, one layer's unit at
        a time) is the paper's stack's (`frameworks.LLAMA3`), applied here."""
        read = ParallelConfig(tp=self.tp, cp=self.cp, pp=self.pp, dp=self.dp, sp=True,
                              schedule="interleaved", virtual_stages=8, cp_impl="allgather")
        return frameworks.apply(frameworks.LLAMA3, ModelConfig.preset("llama3-405b"), read)[0]


# The paper's pipeline: "we reduce one Transformer layer each from the first and the last
# stages" (section 3.3.2), the embedding and the head in chunks of their own, which is the
# split minipar's trainer makes (`workload.stage_loads`).
PAPER_SPLIT = "trainer"

TABLE4 = (
    Table4Row(8192, 8, 1, 16, 64, 8192, 430, 0.43),
    Table4Row(16384, 8, 1, 16, 128, 8192, 400, 0.41),
    Table4Row(16384, 8, 16, 16, 8, 131072, 380, 0.38),
)


TOLERANCE = 4.0        # MFU points: issue 26's "within 4 points of 43/41/38"


def table4(framework: str = "llama3", **changes) -> list[tuple[Table4Row, Estimate]]:
    """Our prediction for each row of Llama 3's Table 4 under `framework` (default:
    the paper's own stack, `frameworks.LLAMA3`): bf16, 16M tokens, micro-batch 1. `changes`:
    fields of the stack's `Efficiency` to change, a what-if for what the paper does not say (its
    kernels, its fabric's bus bandwidth)."""
    model, fw = ModelConfig.preset("llama3-405b"), frameworks.framework(framework)
    out = []
    for row in TABLE4:
        pc, precision, eff = frameworks.apply(fw, model, row.parallel())
        out.append((row, estimate(model, pc, LLAMA3_CLUSTER, row.seq_len,
                                  global_batch_tokens=TABLE4_BATCH_TOKENS, microbatch_size=1,
                                  recompute="none", precision=precision,
                                  efficiency=replace(eff, **changes), stage_split=PAPER_SPLIT)))
    return out


# Fractions of the NIC's line rate the what-if below sweeps: 70% to 95% in steps of 0.5%.
NIC_SWEEP = tuple(round(0.70 + 0.005 * i, 3) for i in range(51))


def nic_sensitivity(fractions: tuple[float, ...] = NIC_SWEEP) -> dict[float, list[float]]:
    """Each row's predicted MFU with NCCL's bus bandwidth across servers at each fraction of
    the NIC's line rate (the model uses nccl-tests' on InfiniBand; Meta's RoCE fabric has no
    published measurement)."""
    return {f: [e.mfu for _, e in table4(network_inter=f)] for f in fractions}


def nic_window(sensitivity: dict[float, list[float]], rows: tuple[int, ...] = (0, 1),
               tolerance: float = TOLERANCE) -> tuple[float, float] | None:
    """The lowest and highest swept fraction at which every row of `rows` (0-based; the two
    the NIC bounds) lands within `tolerance` points of its published MFU, or None. What a
    measurement of the fabric would have to show: choosing the constant from it would be
    fitting it to the rows it is judged on."""
    ok = [f for f, mfus in sensitivity.items()
          if all(100 * abs(mfus[i] - TABLE4[i].mfu) <= tolerance for i in rows)]
    return (min(ok), max(ok)) if ok else None
