"""How long one training step takes, and the MFU that follows: `estimate`.

Chapter "MFU and communication volume". The step time of one GPU is built up as

    t_mb     = compute of one micro-batch through the rank's layers
               + its tensor-parallel all-reduces (exposed: nothing overlaps them)
               + its context-parallel K/V traffic (all-gather: exposed; ring: hidden behind
                 the attention blocks unless it is slower than them)
    pipeline = m * t_mb / (1 - bubble)          (bubble: closed form of the schedule)
    step     = pipeline + exposed p2p (the fill and drain) + exposed DP traffic

DP traffic overlaps with compute only where its data exists: the gradients are final during
the last micro-batch's backward, and the updated parameters are needed by the first forward.
Bytes and bubbles are `minipar.formulas`'; seconds per byte are the cluster's
(`hardware.axis_seconds`); seconds per FLOP the two compute efficiencies (`Efficiency`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .. import flops
from ..config import ConfigError, ModelConfig, ParallelConfig
from ..formulas import (bubble_fraction, cp_layer_bytes, cp_kv_bytes, tp_cross_entropy_bytes,
                        tp_embedding_bytes, tp_head_bytes, tp_layer_bytes, tp_norm_bytes,
                        wire_bytes)
from .constants import (BF16_MIXED, CAUSAL_FRACTION, LLAMA3_EFFICIENCY, Efficiency,
                        Precision)
from .hardware import LLAMA3_CLUSTER, Cluster, axis_seconds
from .memory import memory_per_gpu, param_total_local
from .wire import comm_bytes_per_gpu
from .workload import Workload, layout_problems, make_workload


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
             efficiency: Efficiency = LLAMA3_EFFICIENCY) -> Estimate:
    """Predict one training step of `model` split as `parallel` on `cluster`.

    The batch is `global_batch_tokens` tokens (default: Llama 3's 16M) or `global_batch`
    sequences, of `seq_len` tokens, in micro-batches of `microbatch_size` sequences per DP
    rank; `parallel.microbatches` is derived from those. Raises `ConfigError` (naming the flag
    and the rule) for a layout that cannot run.
    """
    work = make_workload(seq_len, global_batch_tokens, global_batch, microbatch_size, recompute)
    if parallel.dp >= 1 and work.microbatch_size >= 1 and work.global_batch % (parallel.dp * work.microbatch_size) == 0:
        parallel = parallel.replace(microbatches=work.microbatches(parallel))
    bad = cluster.problems() + layout_problems(model, parallel, work)
    if bad:
        raise ConfigError("; ".join(bad))
    return _estimate(model, parallel, cluster, work, precision, efficiency)


def compute_seconds(model: ModelConfig, pc: ParallelConfig, work: Workload, peak: float,
                    eff: Efficiency) -> tuple[float, float]:
    """(all compute, of which attention) of one micro-batch on one GPU, in seconds."""
    tokens = work.tokens_per_microbatch(pc)
    share = tokens / (pc.tp * pc.pp)                 # a balanced pipeline, as Llama 3's
    dense = flops.dense_flops_per_token(model) * share
    attention = CAUSAL_FRACTION * flops.attention_flops_per_token(model, work.seq_len) * share
    again = 4 / 3                                    # a forward again is 1/3 of fwd + bwd
    if work.recompute == "full":
        dense *= again
    if work.recompute in ("selective", "full"):
        attention *= again
    t_attention = attention / (eff.attention * peak)
    return dense / (eff.dense * peak) + t_attention, t_attention


def microbatch_seconds(model: ModelConfig, pc: ParallelConfig, cluster: Cluster, work: Workload,
                       precision: Precision, eff: Efficiency) -> tuple[float, float, float]:
    """(compute, TP, CP) seconds of one micro-batch on one GPU of a balanced pipeline: the
    TP and CP traffic on its critical path, with the first and last stage's extras (the
    embedding, head and loss) spread over the pp ranks."""
    h, act = model.dim, precision.act_bytes
    tokens = work.tokens_per_microbatch(pc)          # per GPU per micro-batch
    layers = model.n_layers / pc.pp                  # per GPU, balanced
    t_compute, t_attention = compute_seconds(model, pc, work, cluster.peak_flops, eff)
    tp_bytes = layers * tp_layer_bytes(tokens, h, pc.tp, act, work.recompute) + (
        tp_embedding_bytes(tokens, h, pc.tp, act, pc.sp) + tp_head_bytes(tokens, h, pc.tp, act)
        + tp_cross_entropy_bytes(tokens, pc.tp)) / pc.pp
    if pc.sp:
        tp_bytes += tp_norm_bytes(round(layers), False, h, pc.tp, precision.grad_bytes)
    t_tp = axis_seconds(tp_bytes, "tp", pc, cluster, eff.network)
    kv = cp_kv_bytes(tokens, model.n_kv_heads // pc.tp, model.head_dim, act)
    cp_bytes = layers * cp_layer_bytes(kv, pc.cp, pc.cp_impl, work.recompute)
    t_cp = axis_seconds(cp_bytes, "cp", pc, cluster, eff.network)
    if pc.cp_impl == "ring":                         # K,V of the next block travel while this
        t_cp = max(0.0, t_cp - t_attention)          # block's attention is computed
    return t_compute, t_tp, t_cp


def p2p_exposed_seconds(model: ModelConfig, pc: ParallelConfig, cluster: Cluster,
                        work: Workload, precision: Precision, eff: Efficiency,
                        t_mb: float) -> float:
    """Pipeline transfers that stick out: p-1 each way while the pipeline fills and drains;
    in between, a send hides behind the next chunk's compute unless it is slower."""
    if pc.pp == 1:
        return 0.0
    size = work.tokens_per_microbatch(pc) * model.dim * precision.act_bytes / (pc.tp if pc.sp else 1)
    t_p2p = axis_seconds(size, "pp", pc, cluster, eff.network)
    chunk = t_mb / pc.virtual_stages
    m = work.microbatches(pc)
    return 2 * (pc.pp - 1) * t_p2p + 2 * m * pc.virtual_stages * max(0.0, t_p2p - chunk)


def dp_exposed_seconds(zero: int, naive: bool, microbatches: int, t_rs: float, t_ag: float,
                       t_mb: float) -> float:
    """DP time that sticks out of the step. Gradients are final only during the last
    micro-batch's backward (2/3 of its time), so that is all a reduction can hide behind;
    the updated weights can be prefetched during the first forward (1/3). ZeRO-2 reduces
    every micro-batch behind its own backward, ZeRO-3 also gathers the weights every time.
    Naive DP (no buckets) overlaps nothing."""
    backward, forward = (0.0, 0.0) if naive else (2 / 3 * t_mb, 1 / 3 * t_mb)

    def exposed(t, window):
        return max(0.0, t - window)
    m = microbatches
    if zero == 0:
        return exposed(2 * t_rs, backward)           # an all-reduce: reduce-scatter + all-gather
    if zero == 1:
        return exposed(t_rs, backward) + exposed(t_ag, forward)
    if zero == 2:
        return m * exposed(t_rs, backward) + exposed(t_ag, forward)
    return m * (exposed(t_ag, forward) + exposed(t_ag + t_rs, backward))


def dp_seconds(model: ModelConfig, pc: ParallelConfig, cluster: Cluster, work: Workload,
               precision: Precision, eff: Efficiency, t_mb: float) -> float:
    """Exposed data-parallel seconds over the dp x cp group, for a balanced stage's share of
    the parameters."""
    n = pc.dp * pc.cp
    params = param_total_local(model, pc.tp) / pc.pp
    rs = wire_bytes("reduce_scatter", n, int(params * precision.grad_bytes))
    ag = wire_bytes("all_gather", n, int(params * precision.param_bytes))
    t_rs = axis_seconds(rs, "dp", pc, cluster, eff.network)
    t_ag = axis_seconds(ag, "dp", pc, cluster, eff.network)
    naive = pc.bucket_mb == 0 and pc.zero < 3
    return dp_exposed_seconds(pc.zero, naive, work.microbatches(pc), t_rs, t_ag, t_mb)


def _estimate(model, pc: ParallelConfig, cluster, work: Workload, precision, eff) -> Estimate:
    gpus, peak, m = pc.world_size, cluster.peak_flops, work.microbatches(pc)
    t_compute, t_tp, t_cp = microbatch_seconds(model, pc, cluster, work, precision, eff)
    t_mb = t_compute + t_tp + t_cp
    bubble = bubble_fraction(pc.schedule, pc.pp, m, pc.virtual_stages)
    t_pipeline = m * t_mb / (1 - bubble)             # the bubble stretches the step
    t_pp = p2p_exposed_seconds(model, pc, cluster, work, precision, eff, t_mb)
    t_dp = dp_seconds(model, pc, cluster, work, precision, eff, t_mb)
    step = t_pipeline + t_pp + t_dp
    model_flops = work.tokens * flops.flops_per_token(model, work.seq_len)
    hw_flops = work.tokens * flops.hardware_flops_per_token(model, work.seq_len, work.recompute)
    mfu = model_flops / (step * gpus * peak)
    gb = {k: v / 1e9 for k, v in memory_per_gpu(model, pc, work, precision).items()}
    return Estimate(
        mfu=mfu, hfu=hw_flops / (step * gpus * peak), tflops_per_gpu=mfu * cluster.peak_tflops,
        step_time_s=step, memory_gb_per_gpu=gb["total"],
        comm_bytes_per_gpu=comm_bytes_per_gpu(model, pc, work, precision),
        bubble_fraction=bubble,
        time_breakdown_s={"compute": m * t_compute, "tp": m * t_tp, "cp": m * t_cp,
                          "bubble": t_pipeline - m * t_mb, "pp": t_pp, "dp": t_dp},
        memory_breakdown_gb={k: gb[k] for k in ("params", "grads", "optimizer", "activations")},
        fits_memory=gb["total"] <= cluster.hbm_gb, microbatches=m,
        tokens_per_s=work.tokens / step, parallel=pc, workload=work)


def wire_seconds(e: Estimate, axis: str, cluster: Cluster,
                 efficiency: Efficiency = LLAMA3_EFFICIENCY) -> float:
    """Seconds pipeline rank 0's bytes of `axis` (`e.comm_bytes_per_gpu`) take at its group's
    bandwidth: the time each axis would cost if nothing overlapped it."""
    return axis_seconds(e.comm_bytes_per_gpu[axis], axis, e.parallel, cluster, efficiency.network)
