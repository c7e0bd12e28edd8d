"""Llama 3's Table 4: the three published layouts of 405B, and our prediction of each.

Chapter "MFU and communication volume" (and "The Llama 3 case study"). The model is judged
here: the hardware's measured constants and the paper's own choices (`frameworks.LLAMA3`),
nothing fitted to these rows.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig, ParallelConfig
from .constants import TABLE4_BATCH_TOKENS
from .frameworks import LLAMA3, apply
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
        return apply(LLAMA3, ModelConfig.preset("llama3-405b"), read)[0]


# The paper's pipeline: "we reduce one Transformer layer each from the first and the last
# stages" (section 3.3.2), the embedding and the head in chunks of their own, which is the
# split minipar's trainer makes (`workload.stage_loads`).
PAPER_SPLIT = "trainer"

TABLE4 = (
    Table4Row(8192, 8, 1, 16, 64, 8192, 430, 0.43),
    Table4Row(16384, 8, 1, 16, 128, 8192, 400, 0.41),
    Table4Row(16384, 8, 16, 16, 8, 131072, 380, 0.38),
)


def table4(framework: str = "llama3") -> list[tuple[Table4Row, Estimate]]:
    """Our prediction for each row of Llama 3's Table 4 under `framework` (default: the
    paper's own stack, `frameworks.LLAMA3`): bf16, 16M tokens, micro-batch 1."""
    model = ModelConfig.preset("llama3-405b")
    return [(row, estimate(model, row.parallel(), LLAMA3_CLUSTER, row.seq_len,
                           global_batch_tokens=TABLE4_BATCH_TOKENS, microbatch_size=1,
                           recompute="none", framework=framework, stage_split=PAPER_SPLIT))
            for row in TABLE4]
