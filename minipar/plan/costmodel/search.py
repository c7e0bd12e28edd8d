"""The layout search: every valid way to split a model over N GPUs, ranked by predicted MFU.

Chapter "MFU and communication volume" (and "4D parallelism": which layout would you pick?).
Brute force over powers of two, each candidate checked by the same rules the trainer
enforces (`estimate` raises `ConfigError` for the rest) and kept only if it fits in HBM.
"""
from __future__ import annotations

import itertools
import math

from ..config import RECOMPUTE_MODES, ConfigError, ModelConfig, ParallelConfig
from .constants import BF16_MIXED, LLAMA3_EFFICIENCY, TABLE4_BATCH_TOKENS, Efficiency, Precision
from .hardware import LLAMA3_CLUSTER, Cluster
from .time import Estimate, estimate
from .workload import END_STAGES


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


def _chunk_counts(schedule: str, pp: int, n_layers: int) -> list[int]:
    """Chunks per rank to try: 1, or for the interleaved schedule every power of two >= 2
    that leaves each of the pp x v stages a layer (the end stages may hold none)."""
    if schedule != "interleaved":
        return [1]
    if pp == 1:
        return []
    most = n_layers + END_STAGES
    return [v for v in _powers_of_two(most) if v > 1 and pp * v <= most]


def best_configs(model: ModelConfig, cluster: Cluster = LLAMA3_CLUSTER, gpus: int = 8192,
                 seq_len: int = 8192, global_batch_tokens: int = TABLE4_BATCH_TOKENS,
                 microbatch_sizes=(1, 2), schedules=("1f1b", "interleaved"),
                 recompute=RECOMPUTE_MODES, zero=(1,), cp_impl: str = "allgather",
                 tps=None, cps=None, pps=None, top: int | None = 10,
                 precision: Precision = BF16_MIXED,
                 efficiency: Efficiency = LLAMA3_EFFICIENCY,
                 framework: str | None = None) -> list[Estimate]:
    """Valid layouts of `gpus` GPUs ranked by predicted MFU, among those that fit in HBM.

    Searched: tp, cp, pp powers of two (tp up to one server; or the degrees `tps`, `cps`,
    `pps` given), dp the rest; each schedule (the interleaved one with every chunk count 2,
    4, ... that fits), micro-batch size, recompute policy and ZeRO stage given. Sequence
    parallelism on whenever tp > 1; `framework` (`frameworks`) sets what that stack does,
    its ZeRO stage among it. `top=None` returns them all.
    """
    tps = tps or _powers_of_two(cluster.gpus_per_node)
    cps = cps or _powers_of_two(gpus)
    pps = pps or _powers_of_two(min(gpus, model.n_layers))
    found = []
    for tp, cp, pp in itertools.product(tps, cps, pps):
        if gpus % (tp * cp * pp):
            continue
        dp = gpus // (tp * cp * pp)
        for sched, mbs, rc, z in itertools.product(schedules, microbatch_sizes, recompute, zero):
            for v in _chunk_counts(sched, pp, model.n_layers):
                pc = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, zero=z, sp=tp > 1,
                                    schedule=sched, virtual_stages=v, cp_impl=cp_impl)
                try:
                    e = estimate(model, pc, cluster, seq_len, global_batch_tokens=global_batch_tokens,
                                 microbatch_size=mbs, recompute=rc, precision=precision,
                                 efficiency=efficiency, framework=framework)
                except ConfigError:
                    continue
                if e.fits_memory:
                    found.append(e)
    found.sort(key=lambda e: -e.mfu)
    return found if top is None else found[:top]
