"""The layout search: every valid way to split a model over N GPUs, ranked by predicted MFU.

Chapter "MFU and communication volume" (and "4D parallelism": which layout would you pick?).
`layouts` is the one enumerator of candidate layouts, the planner's too: powers of two,
each schedule with every chunk count the trainer accepts. Each candidate is then checked
by the same rules the trainer enforces (`estimate` raises `ConfigError` for the rest) and
kept only if it fits in HBM.
"""
from __future__ import annotations

import itertools

from ..config import RECOMPUTE_MODES, ConfigError, ModelConfig, ParallelConfig
from .constants import LLAMA3_EFFICIENCY, TABLE4_BATCH_TOKENS, Efficiency
from .hardware import LLAMA3_CLUSTER, Cluster
from .time import Estimate, estimate
from .workload import END_STAGES, make_workload
from ..memory import BF16_MIXED, Precision


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit` (none when `limit` < 1)."""
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


def largest_tp(model: ModelConfig, limit: int) -> int:
    """The largest power of two <= limit dividing heads, KV heads, FFN and vocabulary."""
    tp = 1
    while 2 * tp <= limit and all(getattr(model, f) % (2 * tp) == 0
                                  for f in ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size")):
        tp *= 2
    return tp


def divisors(n: int) -> list[int]:
    """Every positive divisor of n, smallest first."""
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_degrees(model: ModelConfig, ranks: int) -> list[int]:
    """Expert-parallel degrees to try for `ranks` = dp x cp ranks: 1 for a dense model; for a
    mixture of experts every divisor of the ranks that divides the experts (EP is carved
    from the dp x cp ranks and splits the experts evenly)."""
    if not model.is_moe:
        return [1]
    return [d for d in divisors(ranks) if model.moe_experts % d == 0]


def chunk_counts(schedule: str, pp: int, n_layers: int) -> list[int]:
    """Chunks per rank to try: 1, or for the interleaved schedule every power of two >= 2
    that leaves each of the pp x v stages a layer (the end stages may hold none: the stages
    rule the trainer checks, `ParallelConfig.problems`), and every v that deals the layers
    evenly, n_layers / pp / v a whole number (Megatron's
    --num-layers-per-virtual-pipeline-stage: 80 layers on pp 4 give v = 5)."""
    if schedule != "interleaved":
        return [1]
    if pp == 1:
        return []
    even = divisors(n_layers // pp) if n_layers % pp == 0 else []
    return sorted({v for v in powers_of_two((n_layers + END_STAGES) // pp) + even if v > 1})


def pipeline_degrees(model: ModelConfig, gpus: int) -> list[int]:
    """Pipeline degrees to try: the powers of two, and every divisor of the layer count that
    divides the GPUs (Llama 3.1 405B's 126 layers on 9 stages)."""
    limit = min(gpus, model.n_layers)
    odd = [d for d in divisors(model.n_layers) if d <= limit and gpus % d == 0]
    return sorted(set(powers_of_two(limit) + odd))


def layouts(model: ModelConfig, cluster: Cluster, gpus: int, global_batch: int,
            microbatch_sizes=(1, 2), schedules=("1f1b", "interleaved"), tps=None, cps=None,
            pps=None, cp_impl: str = "allgather"):
    """Each (ParallelConfig, micro-batch size) of `gpus` GPUs: tp, cp powers of two (tp
    within one server and dividing the model's heads, FFN and vocabulary), pp of
    `pipeline_degrees` (or the degrees `tps`, `cps`, `pps` given), dp the rest; each micro-batch size that cuts the
    `global_batch` sequences evenly over the DP ranks; each schedule with each of its
    `chunk_counts`; for a mixture of experts each of its `expert_degrees`. Sequence
    parallelism on whenever tp > 1. The other rules (the
    interleaved schedule's micro-batches in multiples of pp among them) are `estimate`'s."""
    tps = tps or powers_of_two(largest_tp(model, min(cluster.gpus_per_node, gpus)))
    cps = cps or powers_of_two(gpus)
    pps = pps or pipeline_degrees(model, gpus)
    for tp, cp, pp in itertools.product(tps, cps, pps):
        if gpus % (tp * cp * pp):
            continue
        dp = gpus // (tp * cp * pp)
        for mbs in microbatch_sizes:
            if global_batch % (dp * mbs):
                continue
            for schedule, ep in itertools.product(schedules, expert_degrees(model, dp * cp)):
                for v in chunk_counts(schedule, pp, model.n_layers):
                    yield ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, sp=tp > 1,
                                         schedule=schedule, virtual_stages=v,
                                         microbatches=global_batch // (dp * mbs), cp_impl=cp_impl), mbs


def best_configs(model: ModelConfig, cluster: Cluster = LLAMA3_CLUSTER, gpus: int = 8192,
                 seq_len: int = 8192, global_batch_tokens: int = TABLE4_BATCH_TOKENS,
                 microbatch_sizes=(1, 2), schedules=("1f1b", "interleaved"),
                 recompute=RECOMPUTE_MODES, zero=(1,), cp_impl: str = "allgather",
                 tps=None, cps=None, pps=None, top: int | None = 10,
                 precision: Precision = BF16_MIXED,
                 efficiency: Efficiency = LLAMA3_EFFICIENCY,
                 framework: str | None = None) -> list[Estimate]:
    """Valid layouts of `gpus` GPUs ranked by predicted MFU, among those that fit in HBM.

    Searched: each layout and micro-batch size of `layouts` (the interleaved schedule with
    every chunk count 2, 4, ... that fits), with each recompute policy and ZeRO stage given.
    `framework` (`frameworks`) sets what that stack does, its ZeRO stage among it.
    `top=None` returns them all.
    """
    batch = make_workload(seq_len, global_batch_tokens).global_batch
    found = []
    for pc, mbs in layouts(model, cluster, gpus, batch, microbatch_sizes, schedules, tps, cps,
                           pps, cp_impl):
        for rc, z in itertools.product(recompute, zero):
            try:
                e = estimate(model, pc.replace(zero=z), cluster, seq_len,
                             global_batch_tokens=global_batch_tokens, microbatch_size=mbs,
                             recompute=rc, precision=precision, efficiency=efficiency,
                             framework=framework)
            except ConfigError:
                continue
            if e.fits_memory:
                found.append(e)
    found.sort(key=lambda e: -e.mfu)
    return found if top is None else found[:top]
