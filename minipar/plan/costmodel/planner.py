"""The planner: every layout of a model on N GPUs that fits, ranked by predicted MFU, and why.

Chapter "Four dimensions at once". Exhaustive over the search's layouts (`search.layouts`),
pruned: TP, CP, PP powers of two (TP within one server, CP only while each rank keeps >=
1,024 tokens), DP the rest; 1F1B or interleaved with every chunk count the trainer accepts;
micro-batches of 1, 2 or 4 sequences; gradients reduced one layer at a time
(`frameworks.fsdp_unit_mb`, as FSDP does). Two knobs are not searched but *chosen*,
because they only ever cost time: the least activation recomputation (none, selective,
full) and the lowest ZeRO stage (1, then 3) that make the layout fit in memory. "Fits"
keeps `MEMORY_HEADROOM` of HBM free: the memory model counts tensors, not
the CUDA context, NCCL's buffers or the allocator's fragmentation, and a run near the limit
is slow where it does not fail. For each of the best layouts `limiting_term` names the
largest loss and what the step would be without it; when nothing fits,
`binding_constraint` says which rule binds.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..config import ConfigError, ModelConfig, ParallelConfig
from .constants import LLAMA3_EFFICIENCY, Efficiency
from . import frameworks
from .frameworks import fsdp_unit_mb
from .hardware import Cluster
from .memory import fullest_stage, memory_of_rank, memory_per_gpu
from .search import layouts, powers_of_two
from .time import Estimate, estimate
from .workload import Workload, layout_problems, make_workload
from ..memory import BF16_MIXED, Precision

MIN_TOKENS_PER_CP_RANK = 1024
MICROBATCH_SIZES = (1, 2, 4)
# The share of HBM a plan leaves free, 8.6 GB of an H100's 85.9: what the memory model does
# not count. The CUDA context with cuBLAS's and cuDNN's workspaces (about 1 GB), NCCL's
# buffers (4 MiB per channel and peer, per communicator: about 1 GB over a 4D layout's
# groups), Transformer Engine's userbuffers where TP overlaps (about 1 GB) and the caching
# allocator's fragmentation (a few percent of what it holds). An assumption, not fitted:
# every published run of both evaluation sets, NVIDIA's 340B on 128 GPUs among them, fits
# under it (tests/test_costmodel.py); nanotron printed more than the model counts in every
# cell of the Playbook's heatmap (its eager kernels keep more, `evaluate.memory_report`),
# and the Playbook names its 80B on 4 nodes as slow "due to operating near the GPU memory
# limits".
MEMORY_HEADROOM = 0.10
RECOMPUTE_ORDER = ("none", "selective", "full")
ZERO_ORDER = (1, 3)
# What each limiting term is called, and the knob that shrinks it.
REMEDIES = {
    "compute efficiency": "wider GEMMs (a larger micro-batch, a smaller TP) or a faster kernel",
    "tp": "--tp-overlap, or a smaller TP degree",
    "cp": "the ring (overlapped) instead of all-gather, or less CP",
    "bubble": "more micro-batches per DP rank (less DP, or a larger batch) or more virtual stages",
    "pp": "fewer pipeline sends across servers",
    "dp": "more tokens per DP rank (less DP, more PP/TP) or ZeRO-1 instead of ZeRO-3",
    "optimizer": "ZeRO to shard the update",
    "ep": "EP inside a server (NVLink), node-limited routing, or a stack that overlaps the "
          "all-to-alls with compute (DualPipe)",
}


@dataclass
class Plan:
    """What `plan` found: the fitting layouts, best first, and what ruled out the rest."""

    ranked: list[Estimate]
    tried: int
    rejected: dict[str, int] = field(default_factory=dict)
    smallest_memory_gb: float | None = None
    budget_gb: float | None = None           # the HBM less the headroom


def candidates(model: ModelConfig, cluster: Cluster, gpus: int, seq_len: int,
               global_batch: int, tp_overlap: bool = False):
    """Each (ParallelConfig without ZeRO/recompute, micro-batch size) of the pruned space:
    the search's `layouts`, CP kept while each rank has `MIN_TOKENS_PER_CP_RANK` tokens,
    gradients reduced per layer (FSDP's unit)."""
    cps = [c for c in powers_of_two(gpus) if c == 1 or seq_len // c >= MIN_TOKENS_PER_CP_RANK]
    for pc, mbs in layouts(model, cluster, gpus, global_batch, MICROBATCH_SIZES, cps=cps):
        yield pc.replace(bucket_mb=fsdp_unit_mb(model, pc.tp),
                         tp_overlap=tp_overlap and pc.tp > 1), mbs


def memory_budget_gb(cluster: Cluster, headroom: float = MEMORY_HEADROOM) -> float:
    """GB per GPU a plan may fill: the HBM less the headroom."""
    return (1.0 - headroom) * cluster.hbm_gb


def fit_memory(model: ModelConfig, pc: ParallelConfig, budget_gb: float, seq_len: int,
               global_batch: int, mbs: int, precision: Precision, zeros=ZERO_ORDER):
    """The cheapest (ZeRO stage of `zeros`, recompute) under which the layout fits in
    `budget_gb`, or (None, the GB of the leanest: the last ZeRO stage with full
    recomputation, tried first so a hopeless layout costs one evaluation)."""
    def setting(zero, rc):
        return pc.replace(zero=zero, recompute=rc), Workload(seq_len, global_batch, mbs, rc)

    def gb(trial, work, stage=None):     # the fullest rank's GB, or rank `stage`'s
        if stage is None:
            return memory_per_gpu(model, trial, work, precision)["total"] / 1e9
        return memory_of_rank(model, trial, work, precision, stage)["total"] / 1e9
    leanest = setting(zeros[-1], RECOMPUTE_ORDER[-1])
    least = gb(*leanest)
    if least > budget_gb:
        return None, least
    # One rank over the budget is enough to rule a setting out (the fullest holds at least as
    # much): try the leanest's fullest rank before all of them.
    likely = fullest_stage(model, *leanest, precision)
    for zero, rc in itertools.product(zeros, RECOMPUTE_ORDER):
        trial, work = setting(zero, rc)
        if gb(trial, work, likely) <= budget_gb and gb(trial, work) <= budget_gb:
            return trial, work
    return leanest


def plan(model: ModelConfig, cluster: Cluster, gpus: int, seq_len: int = 8192,
         global_batch_tokens: int = 4 * 2**20, top: int = 5, tp_overlap: bool | None = False,
         precision: Precision = BF16_MIXED, efficiency: Efficiency = LLAMA3_EFFICIENCY,
         headroom: float = MEMORY_HEADROOM,
         framework: str | frameworks.Framework | None = None) -> Plan:
    """Rank every valid layout of `model` on `gpus` GPUs of `cluster` that fits in the HBM
    less `headroom` (a fraction), by MFU. `framework` (a name of `frameworks.FRAMEWORKS`, or a
    `Framework` itself, one recipe's knobs set):
    every candidate runs that stack (`frameworks.apply`: its kernels, reduce dtype, DP
    buckets and TP overlap, and its ZeRO stage instead of the cheapest that fits);
    `tp_overlap` None then keeps the framework's own."""
    batch = make_workload(seq_len, global_batch_tokens).global_batch    # the batch's rules
    if not 0 <= headroom < 1:
        raise ConfigError(f"--memory-headroom {headroom} must be a fraction in [0, 1)")
    fw = frameworks.framework(framework) if isinstance(framework, str) else framework
    budget = memory_budget_gb(cluster, headroom)
    found, tried, rejected, least = [], 0, {}, None
    for pc, mbs in candidates(model, cluster, gpus, seq_len, batch, bool(tp_overlap)):
        tried += 1
        prec, eff, zeros = precision, efficiency, ZERO_ORDER
        if fw is not None:
            pc, prec, eff = frameworks.apply(fw, model, pc, precision, tp_overlap)
            own = fw.zero_with_pp if pc.pp > 1 and fw.zero_with_pp is not None else fw.zero
            zeros = ZERO_ORDER if own is None else (own,)
        zeros = tuple(z for z in zeros if pc.ep == 1 or z < 3)     # the trainer's rule
        if not zeros or layout_problems(model, pc, Workload(seq_len, batch, mbs)):
            rejected["rules"] = rejected.get("rules", 0) + 1
            continue
        fitted, work = fit_memory(model, pc, budget, seq_len, batch, mbs, prec, zeros)
        if fitted is None:
            rejected["memory"] = rejected.get("memory", 0) + 1
            least = work if least is None else min(least, work)
            continue
        found.append(estimate(model, fitted, cluster, seq_len, global_batch=batch,
                              microbatch_size=mbs, recompute=work.recompute,
                              precision=prec, efficiency=eff))
    found.sort(key=lambda e: -e.mfu)
    return Plan(found if top is None else found[:top], tried, rejected, least, budget)


def losses(e: Estimate) -> dict[str, float]:
    """Seconds of the step lost to each term: the compute beyond the ideal (the model's
    FLOPs at peak: MFU x step), each exposed communication, the bubble, the optimizer."""
    out = {"compute efficiency": e.time_breakdown_s["compute"] - e.mfu * e.step_time_s}
    out.update({k: v for k, v in e.time_breakdown_s.items() if k != "compute"})
    return out


def limiting_term(e: Estimate) -> tuple[str, float, str, float, float]:
    """(largest loss, its share of the step, the largest loss that is *not* the compute's,
    its share, the MFU without it). The first is "memory" when the layout needed full
    recomputation or ZeRO-3 to fit: memory then bounds what the rest can do."""
    lost = losses(e)
    first = max(lost, key=lost.get)
    rest = {k: v for k, v in lost.items() if k != "compute efficiency"}
    second = max(rest, key=rest.get)
    without = e.mfu * e.step_time_s / (e.step_time_s - rest[second])
    if e.workload.recompute == "full" or e.parallel.zero == 3:
        first = "memory"
    return (first, lost.get(first, 0.0) / e.step_time_s, second,
            rest[second] / e.step_time_s, without)


def binding_constraint(p: Plan, cluster: Cluster) -> str:
    """Why nothing fits, in one line."""
    if p.tried == 0:
        return ("no layout divides the GPUs and the batch: --gpus and --global-batch-tokens / "
                "--seq-len must share powers of two")
    if p.rejected.get("memory"):
        budget = cluster.hbm_gb if p.budget_gb is None else p.budget_gb
        return (f"memory: the leanest layout (full recomputation, ZeRO-3) still needs "
                f"{p.smallest_memory_gb:.0f} GB per GPU, over the {budget:.0f} GB a plan may fill "
                f"({cluster.hbm_gb:g} GB of HBM less the headroom): more GPUs, a GPU with "
                f"more memory, or shorter sequences")
    return "every layout breaks a rule of the model (heads, layers) or the batch: see --tp/--pp limits"


def describe(e: Estimate) -> str:
    p, w = e.parallel, e.workload
    return (f"TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp}" + (f" EP{p.ep}" if p.ep > 1 else "") + f" {p.schedule}"
            + (f" v{p.virtual_stages}" if p.virtual_stages > 1 else "")
            + f" mbs{w.microbatch_size} ZeRO-{p.zero} recompute {w.recompute}"
            + (" tp-overlap" if p.tp_overlap else ""))
