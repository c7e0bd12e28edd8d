"""How long one training step takes, and the MFU that follows: `estimate`.

Chapter "MFU and communication volume" (and "Four dimensions at once"). The step time of
one GPU is built up as

    t_mb     = compute of one micro-batch through the rank's layers (`kernels`: matmuls by
               a roofline, attention by its curve, the rest by bytes)
               + its exposed TP traffic (all of it, or with --tp-overlap what the ring
                 steps cannot hide behind the matmuls)
               + its exposed CP traffic (ring: hidden behind attention if it can be)
    pipeline = m * t_mb / (1 - bubble)          (bubble: closed form of the schedule)
    step     = pipeline + exposed p2p + exposed DP + SP's norm all-reduce + the optimizer

What overlaps with what is `exposure`'s; bytes and bubbles are `minipar.plan.formulas`'; seconds
per byte the cluster's (`hardware.axis_seconds`, latency + bytes / bandwidth per link
level); the kernels' speeds are measured (`constants`), nothing is fitted to an MFU.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .. import flops
from ..config import ConfigError, ModelConfig, ParallelConfig
from ..formulas.pipeline_parallel import bubble_fraction
from ..formulas.tensor_parallel import (tp_cross_entropy_bytes, tp_embedding_bytes,
                                        tp_head_bytes, tp_norm_bytes)
from . import frameworks, kernels
from .constants import BF16_MIXED, LLAMA3_EFFICIENCY, Efficiency, Precision
from .exposure import (cp_seconds, dp_collective_seconds, dp_exposed_seconds,
                       first_backward_delay, p2p_exposed_seconds, p2p_message_bytes,
                       pipeline_drain_seconds, tp_exposed_seconds)
from .hardware import LLAMA3_CLUSTER, Cluster, axis_seconds
from .memory import memory_per_gpu, param_total_local
from .wire import comm_bytes_per_gpu, pipeline_bytes
from .workload import Workload, layout_problems, make_workload, stage_loads


@dataclass
class Estimate:
    """What `estimate` predicts for one step. `as_dict()` is the CLI's JSON."""

    mfu: float
    hfu: float
    tflops_per_gpu: float
    step_time_s: float
    memory_gb_per_gpu: float
    comm_bytes_per_gpu: dict
    bubble_fraction: float
    time_breakdown_s: dict = field(default_factory=dict)
    memory_breakdown_gb: dict = field(default_factory=dict)
    fits_memory: bool = True
    microbatches: int = 1
    tokens_per_s: float = 0.0
    parallel: ParallelConfig | None = None
    workload: Workload | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["parallel"] = self.parallel.as_dict() if self.parallel else None
        d["workload"] = asdict(self.workload) if self.workload else None
        return d


def estimate(model: ModelConfig, parallel: ParallelConfig, cluster: Cluster = LLAMA3_CLUSTER,
             seq_len: int = 8192, global_batch_tokens: int | None = None,
             global_batch: int | None = None, microbatch_size: int = 1,
             recompute: str = "none", precision: Precision = BF16_MIXED,
             efficiency: Efficiency = LLAMA3_EFFICIENCY, framework: str | None = None,
             stage_split: str = "even") -> Estimate:
    """Predict one training step of `model` split as `parallel` on `cluster`.

    The batch is `global_batch_tokens` tokens (default: Llama 3's 16M) or `global_batch`
    sequences, of `seq_len` tokens, in micro-batches of `microbatch_size` sequences per DP
    rank; `parallel.microbatches` is derived from those. `framework` (a name of
    `frameworks.FRAMEWORKS`) sets what that stack does: its kernels (replacing `efficiency`),
    reduce dtype, DP buckets or units, ZeRO stage and TP overlap. `stage_split`: how layers
    and the head go to pipeline ranks (`workload.stage_loads`). Raises `ConfigError`
    (naming the flag and the rule) for a layout that cannot run.
    """
    if framework is not None:
        parallel, precision, efficiency = frameworks.apply(frameworks.framework(framework), model,
                                                           parallel, precision)
    work = replace(make_workload(seq_len, global_batch_tokens, global_batch, microbatch_size,
                                 recompute), stage_split=stage_split)
    if parallel.dp >= 1 and work.microbatch_size >= 1 and work.global_batch % (parallel.dp * work.microbatch_size) == 0:
        parallel = parallel.replace(microbatches=work.microbatches(parallel))
    bad = cluster.problems() + layout_problems(model, parallel, work)
    if bad:
        raise ConfigError("; ".join(bad))
    return _estimate(model, parallel, cluster, work, precision, efficiency)


def compute_seconds(model: ModelConfig, pc: ParallelConfig, work: Workload, cluster: Cluster,
                    eff: Efficiency) -> dict[str, float]:
    """Compute of one micro-batch on one GPU, by kernel kind:
    {"matmul", "attention", "elementwise", "overhead"} seconds of the pipeline rank that
    sets the pace (`pace_stage`), the per-linear times ("linears": {name: (forward,
    backward)} of one block) that TP overlap hides behind, that rank's "layers", and the
    "balance" of the pipeline's ranks (mean over pace rank compute)."""
    tokens = work.tokens_per_microbatch(pc)
    linears = kernels.layer_matmul_seconds(model, tokens, pc.tp, cluster)
    head = (sum(kernels.linear_seconds(tokens, model.dim, model.vocab_size / pc.tp, cluster))
            + kernels.cross_entropy_seconds(tokens, model.vocab_size / pc.tp, cluster, eff.cross_entropy))
    attention = kernels.attention_seconds(model, tokens, work.seq_len, pc.cp, pc.tp,
                                          cluster, eff.attention)
    elementwise = kernels.elementwise_seconds(model, tokens, pc.tp, pc.sp, cluster, eff.elementwise)
    per_layer = sum(f + b for f, b in linears.values()) + attention + elementwise
    split = stage_loads(model, pc.pp, work.stage_split, pc.virtual_stages)
    layers, head_share = pace_stage(split, per_layer, head)
    loads = [n * per_layer + share * head for n, share in split]
    matmul = layers * sum(f + b for f, b in linears.values()) + head * head_share
    attention, elementwise = layers * attention, layers * elementwise
    if work.recompute == "full":                     # the forward again: a third of the work
        matmul += layers * sum(f for f, _ in linears.values())
        elementwise *= 4 / 3
    if work.recompute in ("selective", "full"):
        attention *= 4 / 3
    # Gradient accumulation over micro-batches: each backward adds its bf16 weight gradients
    # into the fp32 buffer (read 2 + 4 bytes, write 4), a memory-bound pass per micro-batch.
    if work.microbatches(pc) > 1:
        params = layers * kernels.layer_params(model, pc.tp)
        elementwise += kernels.stream_seconds(params * 10.0, cluster)
    out = {"matmul": matmul, "attention": attention, "elementwise": elementwise}
    out["overhead"] = eff.overhead * sum(out.values())
    # the mean rank's compute over the pace rank's: the pipeline fills and drains through
    # every rank, so its idle time is counted in the mean rank's micro-batches
    return {**out, "linears": linears, "layers": layers, "balance": sum(loads) / len(loads) / max(loads)}


def pass_seconds(model: ModelConfig, pc: ParallelConfig, work: Workload, cluster: Cluster,
                 eff: Efficiency) -> dict[str, float]:
    """The kernels of `compute_seconds` split by pass, for one micro-batch on one GPU, as a
    replay (`minipar.replay`) times each action: one layer's forward "F", its input-gradient
    backward "B" and weight-gradient "W" (zero-bubble runs them as separate actions), the
    head and loss "head_F" and "head_B", and the optimizer's update of the rank's share
    "optimizer" (as `step_extras`). The attention core's backward computes twice its forward (8 h s
    against 4 h s FLOPs per token), pointwise kernels' backward moves twice its bytes."""
    tokens = work.tokens_per_microbatch(pc)
    lins = kernels.layer_linears(model, pc.tp).values()
    f = sum(kernels.matmul_seconds(tokens, d_out, d_in, cluster) for d_in, d_out in lins)
    b = sum(kernels.matmul_seconds(tokens, d_in, d_out, cluster) for d_in, d_out in lins)
    w = sum(kernels.matmul_seconds(d_in, d_out, tokens, cluster) for d_in, d_out in lins)
    att = kernels.attention_seconds(model, tokens, work.seq_len, pc.cp, pc.tp, cluster, eff.attention)
    ew = kernels.elementwise_seconds(model, tokens, pc.tp, pc.sp, cluster, eff.elementwise)
    if work.microbatches(pc) > 1:     # gradient accumulation into fp32, as compute_seconds
        w += kernels.stream_seconds(kernels.layer_params(model, pc.tp) * 10.0, cluster)
    head_f, head_b = kernels.linear_seconds(tokens, model.dim, model.vocab_size / pc.tp, cluster)
    loss = kernels.cross_entropy_seconds(tokens, model.vocab_size / pc.tp, cluster, eff.cross_entropy)
    extra = att / 3 if work.recompute == "selective" else 0.0
    shards = pc.dp * pc.cp if pc.zero >= 1 else 1
    k = 1 + eff.overhead
    return {"F": k * (f + att / 3 + ew / 3), "B": k * (b + 2 * att / 3 + 2 * ew / 3 + extra),
            "W": k * w, "head_F": k * (head_f + loss / 3), "head_B": k * (head_b + 2 * loss / 3),
            "optimizer": kernels.optimizer_seconds(param_total_local(model, pc.tp) / pc.pp / shards,
                                                   cluster)}


def pace_stage(split: list[tuple[float, float]], per_layer: float,
               head: float) -> tuple[float, float]:
    """(layers, head share) of the pipeline rank with the most seconds of compute among the
    ranks' (layers, head share) `split` (`workload.stage_loads`): in a pipeline every rank
    waits for the slowest."""
    return max(split, key=lambda s: s[0] * per_layer + s[1] * head)


def microbatch_seconds(model: ModelConfig, pc: ParallelConfig, cluster: Cluster, work: Workload,
                       precision: Precision, eff: Efficiency) -> dict[str, float]:
    """{"compute", "attention", "tp", "cp"} seconds of one micro-batch on one GPU of a
    balanced pipeline: its compute, and the exposed TP and CP traffic on its critical path
    (the first and last stage's extras, embedding, head and loss, spread over the pp ranks)."""
    h, act = model.dim, precision.act_bytes
    tokens = work.tokens_per_microbatch(pc)
    parts = compute_seconds(model, pc, work, cluster, eff)
    linears, layers, balance = parts.pop("linears"), parts.pop("layers"), parts.pop("balance")
    t_tp = layers * tp_exposed_seconds(model, pc, cluster, work, precision, eff, linears)
    ends = (tp_embedding_bytes(tokens, h, pc.tp, act, pc.sp) + tp_head_bytes(tokens, h, pc.tp, act)
            + tp_cross_entropy_bytes(tokens, pc.tp)) / pc.pp
    t_tp += axis_seconds(ends, "tp", pc, cluster, eff.links, "all_reduce", 5 / pc.pp)
    t_att = parts["attention"] / layers if layers else 0.0    # a stage of the head alone
    t_cp = layers * cp_seconds(model, pc, cluster, work, precision, eff, t_att)
    return {"compute": sum(parts.values()), "attention": parts["attention"], "tp": t_tp, "cp": t_cp,
            "balance": balance}


def dp_terms(model: ModelConfig, pc: ParallelConfig, cluster: Cluster, work: Workload,
             precision: Precision, eff: Efficiency, t_mb: float) -> dict[str, float]:
    """Data parallelism's side of one step, each term `dp_exposed_seconds` weighs: one
    reduce-scatter of the rank's gradients and one all-gather of its weights, the drain an
    interleaved pipeline lends, how late the first backward comes, the pipeline's sends on
    the same NIC, and what sticks out ("exposed")."""
    params = param_total_local(model, pc.tp) / pc.pp
    t_rs, t_ag = dp_collective_seconds(params, pc, cluster, precision, eff)
    naive = pc.bucket_mb == 0 and pc.zero < 3
    out = {"reduce_scatter": t_rs, "all_gather": t_ag,
           "drain": pipeline_drain_seconds(pc.pp, pc.virtual_stages, t_mb),
           "late": first_backward_delay(pc.pp, pc.virtual_stages, t_mb),
           "pp_nic": pipeline_nic_seconds(model, pc, cluster, work, precision, eff)}
    out["exposed"] = dp_exposed_seconds(pc.zero, naive, work.microbatches(pc), t_rs, t_ag, t_mb,
                                        out["drain"], out["late"], out["pp_nic"])
    return out


def critical_seconds(mb: dict[str, float]) -> float:
    """One micro-batch on the critical path (`microbatch_seconds`): compute and the TP and CP
    traffic nothing hides."""
    return mb["compute"] + mb["tp"] + mb["cp"]


def step_extras(model: ModelConfig, pc: ParallelConfig, cluster: Cluster, work: Workload,
                precision: Precision, eff: Efficiency, t_mb: float) -> dict[str, float]:
    """Seconds paid once per step: the exposed DP traffic (`dp_terms`), SP's norm-gradient
    all-reduce (once per step, after the micro-batches) and the optimizer's update of the
    rank's share (ZeRO shards it over the dp x cp group)."""
    params = param_total_local(model, pc.tp) / pc.pp
    norms = 0.0
    if pc.sp:
        nbytes = tp_norm_bytes(round(model.n_layers / pc.pp), False, model.dim, pc.tp,
                               precision.grad_bytes)
        norms = axis_seconds(nbytes, "tp", pc, cluster, eff.links, "all_reduce", 1)
    shards = pc.dp * pc.cp if pc.zero >= 1 else 1
    return {"dp": dp_terms(model, pc, cluster, work, precision, eff, t_mb)["exposed"], "tp_norms": norms,
            "optimizer": kernels.optimizer_seconds(params / shards, cluster)}


def pipeline_nic_seconds(model: ModelConfig, pc: ParallelConfig, cluster: Cluster, work: Workload,
                         precision: Precision, eff: Efficiency) -> float:
    """Seconds the pipeline's sends of one step (`wire.pipeline_bytes`: an activation
    forward and a gradient back, per micro-batch and chunk, on the busiest rank) keep a
    rank's NIC busy, when its pipeline neighbours sit in other servers (a model copy of
    tp x cp GPUs fills them): the NIC that DP's reductions use too."""
    if pc.pp == 1 or pc.tp * pc.cp < cluster.gpus_per_node:
        return 0.0
    busiest = max(pipeline_bytes(model, pc, work, precision, stage) for stage in range(pc.pp))
    sends = busiest / p2p_message_bytes(model, pc, work, precision)
    return axis_seconds(busiest, "pp", pc, cluster, eff.links, "send", sends)


def _estimate(model, pc: ParallelConfig, cluster, work: Workload, precision, eff) -> Estimate:
    gpus, peak, m = pc.world_size, cluster.peak_flops, work.microbatches(pc)
    mb = microbatch_seconds(model, pc, cluster, work, precision, eff)
    t_mb = critical_seconds(mb)
    bubble = bubble_fraction(pc.schedule, pc.pp, m, pc.virtual_stages)
    # the bubble stretches the step: bubble / (1 - bubble) of the micro-batches' time, that of
    # the mean rank (the fill and drain pass through all of them), m of the pace rank's
    t_pipeline = m * t_mb * (1 + bubble / (1 - bubble) * mb["balance"])
    t_pp = p2p_exposed_seconds(model, pc, cluster, work, precision, eff, t_mb)
    extra = step_extras(model, pc, cluster, work, precision, eff, t_mb)
    step = t_pipeline + t_pp + sum(extra.values())
    model_flops = work.tokens * flops.flops_per_token(model, work.seq_len)
    hw_flops = work.tokens * flops.hardware_flops_per_token(model, work.seq_len, work.recompute)
    mfu = model_flops / (step * gpus * peak)
    gb = {k: v / 1e9 for k, v in memory_per_gpu(model, pc, work, precision).items()}
    return Estimate(
        mfu=mfu, hfu=hw_flops / (step * gpus * peak), tflops_per_gpu=mfu * cluster.peak_tflops,
        step_time_s=step, memory_gb_per_gpu=gb["total"],
        comm_bytes_per_gpu=comm_bytes_per_gpu(model, pc, work, precision),
        bubble_fraction=bubble,
        time_breakdown_s={"compute": m * mb["compute"], "tp": m * mb["tp"] + extra["tp_norms"],
                          "cp": m * mb["cp"], "bubble": t_pipeline - m * t_mb, "pp": t_pp,
                          "dp": extra["dp"], "optimizer": extra["optimizer"]},
        memory_breakdown_gb={k: gb[k] for k in ("params", "grads", "optimizer", "activations")},
        fits_memory=gb["total"] <= cluster.hbm_gb, microbatches=m,
        tokens_per_s=work.tokens / step, parallel=pc, workload=work)


def wire_seconds(e: Estimate, axis: str, cluster: Cluster,
                 efficiency: Efficiency = LLAMA3_EFFICIENCY) -> float:
    """Seconds pipeline rank 0's bytes of `axis` (`e.comm_bytes_per_gpu`) take at its group's
    bandwidth: the time each axis would cost if nothing overlapped it."""
    return axis_seconds(e.comm_bytes_per_gpu[axis], axis, e.parallel, cluster, efficiency.links)
