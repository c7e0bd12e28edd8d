"""One step to predict, as one value: the model, the hardware, the layout, the stack, the batch.

Chapter "MFU and communication volume". Every function of the step's time (`time`,
`exposure`) asks the same question of the same five things, so they travel together: a
frozen `Scenario`. `scenario` builds one from the flags' pieces the way a run would: it
applies the named framework (`frameworks.apply`), cuts the batch into micro-batches, and
refuses, naming the flag and the rule, a layout the trainer would refuse.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import ConfigError, ModelConfig, ParallelConfig
from . import frameworks
from .constants import LLAMA3_EFFICIENCY, Efficiency
from .hardware import LLAMA3_CLUSTER, Cluster, axis_seconds
from .workload import Workload, layout_problems, make_workload
from ..memory import BF16_MIXED, Precision


@dataclass(frozen=True)
class Scenario:
    """One training step: `model` split as `parallel` on `cluster`, processing the batch
    `work`, under a software stack's `precision` (what it stores and sends) and `efficiency`
    (its kernels and what NCCL reaches of the links)."""

    model: ModelConfig
    parallel: ParallelConfig
    cluster: Cluster
    work: Workload
    precision: Precision
    efficiency: Efficiency

    @property
    def microbatches(self) -> int:
        """Micro-batches per DP rank in one step."""
        return self.work.microbatches(self.parallel)

    @property
    def tokens(self) -> int:
        """Tokens one GPU processes per micro-batch: its 1/cp of each sequence."""
        return self.work.tokens_per_microbatch(self.parallel)

    def seconds(self, nbytes: float, axis: str, op: str | None = None, calls: float = 0) -> float:
        """`nbytes` through one group of `axis` of this layout, at this stack's share of the
        links (`hardware.axis_seconds`)."""
        return axis_seconds(nbytes, axis, self.parallel, self.cluster, self.efficiency.links, op, calls)

    def problems(self) -> list[str]:
        """Every rule of the hardware, model, layout and batch this step breaks."""
        return self.cluster.problems() + layout_problems(self.model, self.parallel, self.work)


def scenario(model: ModelConfig, parallel: ParallelConfig, cluster: Cluster = LLAMA3_CLUSTER,
             seq_len: int = 8192, global_batch_tokens: int | None = None,
             global_batch: int | None = None, microbatch_size: int = 1,
             recompute: str = "none", precision: Precision = BF16_MIXED,
             efficiency: Efficiency = LLAMA3_EFFICIENCY, framework: str | None = None,
             stage_split: str = "even", recompute_layers: int | None = None,
             moe_imbalance: float = 1.0) -> Scenario:
    """The step of `model` split as `parallel` on `cluster`, checked.

    The batch is `global_batch_tokens` tokens (default: Llama 3's 16M) or `global_batch`
    sequences, of `seq_len` tokens, in micro-batches of `microbatch_size` sequences per DP
    rank; `parallel.microbatches` is derived from those. `framework` (a name of
    `frameworks.FRAMEWORKS`) sets what that stack does: its kernels (replacing `efficiency`),
    reduce dtype, DP buckets or units, ZeRO stage and TP overlap. `stage_split`: how layers
    and the head go to pipeline ranks (`workload.stage_loads`). `recompute_layers` N: full
    recomputation of only the first N layers of each model chunk (`make_workload`).
    `moe_imbalance`: a mixture of experts' busiest expert load over the mean. Raises `ConfigError`
    (naming the flag and the rule) for a layout that cannot run.
    """
    if framework is not None:
        parallel, precision, efficiency = frameworks.apply(frameworks.framework(framework), model,
                                                           parallel, precision)
    work = replace(make_workload(seq_len, global_batch_tokens, global_batch, microbatch_size,
                                 recompute, recompute_layers), stage_split=stage_split,
                   moe_imbalance=moe_imbalance)
    if parallel.dp >= 1 and work.microbatch_size >= 1 and work.global_batch % (parallel.dp * work.microbatch_size) == 0:
        parallel = parallel.replace(microbatches=work.microbatches(parallel))
    s = Scenario(model, parallel, cluster, work, precision, efficiency)
    bad = s.problems()
    if bad:
        raise ConfigError("; ".join(bad))
    return s
