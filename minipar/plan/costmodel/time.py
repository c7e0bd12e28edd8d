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
Each function takes the step as one `Scenario` and returns a typed result.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .. import flops
from ..config import ModelConfig, ParallelConfig
from . import experts, kernels
from .constants import LLAMA3_EFFICIENCY, Efficiency
from .exposure import (cp_seconds, dp_collective_seconds, dp_exposed_seconds,
                       first_backward_delay, p2p_exposed_seconds, p2p_message_bytes,
                       pipeline_drain_seconds, tp_exposed_seconds)
from .hardware import LLAMA3_CLUSTER, Cluster, axis_seconds
from .memory import expert_total_local, memory_per_gpu, param_total_local
from .scenario import Scenario, scenario
from .wire import comm_bytes_per_gpu, pipeline_bytes
from .workload import Workload, stage_loads
from ..schedules import stage_layer_counts
from ..formulas.pipeline_parallel import bubble_fraction
from ..formulas.tensor_parallel import (tp_cross_entropy_bytes, tp_embedding_bytes,
                                        tp_head_bytes, tp_norm_bytes)


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
    ep: dict = field(default_factory=dict)   # a mixture of experts' all-to-alls (`experts.ep_report`)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["parallel"] = self.parallel.as_dict() if self.parallel else None
        d["workload"] = asdict(self.workload) if self.workload else None
        if not self.ep:            # a dense step has no expert parallelism to report
            del d["ep"]
        return d


def estimate(model: ModelConfig, parallel: ParallelConfig, cluster: Cluster = LLAMA3_CLUSTER,
             seq_len: int = 8192, **batch_and_stack) -> Estimate:
    """Predict one training step of `model` split as `parallel` on `cluster` (default:
    Llama 3's), sequences of `seq_len` tokens: the `Scenario` that `scenario.scenario`
    builds and checks from these and the batch and stack it takes (`global_batch_tokens`
    or `global_batch`, `microbatch_size`, `recompute`, `recompute_layers`, `precision`,
    `efficiency`, `framework`, `stage_split`), predicted by `step_estimate`. Raises `ConfigError`
    (naming the flag and the rule) for a layout that cannot run."""
    return step_estimate(scenario(model, parallel, cluster, seq_len, **batch_and_stack))


@dataclass(frozen=True)
class Compute:
    """Compute of one micro-batch on the pipeline rank that sets the pace (`pace_stage`),
    by kernel kind, with what TP overlap hides behind and the pipeline's balance."""

    matmul: float
    attention: float
    elementwise: float
    linears: dict             # {linear: (forward, backward)} seconds of one block
    layers: float             # the pace rank's layers
    balance: float            # the mean rank's compute over the pace rank's
    recomputed: float = 0.0   # of those, the layers whose forward runs again (full recompute)

    @property
    def seconds(self) -> float:
        return self.matmul + self.attention + self.elementwise


def compute_seconds(s: Scenario) -> Compute:
    """Compute of one micro-batch on one GPU, by kernel kind (`Compute`)."""
    model, pc, work, cluster, eff = s.model, s.parallel, s.work, s.cluster, s.efficiency
    tokens = s.tokens
    linears = kernels.layer_matmul_seconds(model, tokens, pc.tp, cluster,
                                           eff.tp_comm_sms if pc.tp_overlap else ())
    head = (sum(kernels.linear_seconds(tokens, model.dim, model.vocab_size / pc.tp, cluster))
            + kernels.cross_entropy_seconds(tokens, model.vocab_size / pc.tp, cluster, eff.cross_entropy))
    attention = kernels.attention_seconds(model, tokens, work.seq_len, pc.cp, pc.tp,
                                          cluster, eff.attention, pc.cp_impl)
    elementwise = kernels.elementwise_seconds(model, tokens, pc.tp, pc.sp, cluster, eff.elementwise)
    moe, share = experts.block_seconds(s), moe_share(model)
    per_layer = (sum(f + b for f, b in linears.values()) + attention + elementwise
                 + share * (moe.matmul + moe.elementwise))
    split = stage_loads(model, pc.pp, work.stage_split, pc.virtual_stages)
    layers, head_share = pace_stage(split, per_layer, head)
    loads = [n * per_layer + share * head for n, share in split]
    matmul = layers * sum(f + b for f, b in linears.values()) + head * head_share
    # the forward again: a third of the work, of every kernel of the `redone` layers (all
    # the rank's layers under full recomputation, the first --recompute-layers of each of
    # its chunks with a count), of the attention core under selective recomputation
    redone = (layers if work.recompute == "full" and work.recompute_layers is None else
              work.recomputed_layers([layers / pc.virtual_stages] * pc.virtual_stages))
    matmul += redone * sum(f for f, _ in linears.values())
    # a mixture of experts' blocks (their share of the rank's layers): the experts' GEMMs and
    # permutes beyond a dense block's, the forward again where it is recomputed
    matmul += share * (layers + redone / 3) * moe.matmul
    if work.recompute_layers is not None:
        attention, elementwise = (layers + redone / 3) * attention, (layers + redone / 3) * elementwise
    else:
        attention, elementwise = layers * attention, layers * elementwise
        if work.recompute == "full":
            elementwise *= 4 / 3
        if work.recompute in ("selective", "full"):
            attention *= 4 / 3
    elementwise += share * layers * moe.elementwise
    # Gradient accumulation over micro-batches: each backward adds its bf16 weight gradients
    # into the fp32 buffer (read 2 + 4 bytes, write 4), a memory-bound pass per micro-batch.
    if s.microbatches > 1:
        params = layers * kernels.layer_params(model, pc.tp)
        elementwise += kernels.stream_seconds(params * 10.0, cluster)
    # the mean rank's compute over the pace rank's: the pipeline fills and drains through
    # every rank, so its idle time is counted in the mean rank's micro-batches
    return Compute(matmul, attention, elementwise, linears, layers,
                   sum(loads) / len(loads) / max(loads), redone)


@dataclass(frozen=True)
class Passes:
    """Seconds of each action a replay times (`minipar.replay`), one micro-batch on one GPU:
    one layer's forward "F", input-gradient backward "B" and weight-gradient "W", the head
    and loss "head_F" and "head_B", and the optimizer's update of the rank's share."""

    F: float
    B: float
    W: float
    head_F: float
    head_B: float
    optimizer: float


def pass_seconds(s: Scenario) -> Passes:
    """The kernels of `compute_seconds` split by pass (zero-bubble runs B and W as separate
    actions), the optimizer as `step_extras`. The attention core's backward computes twice
    its forward (8 h s against 4 h s FLOPs per token), pointwise kernels' backward moves
    twice its bytes."""
    model, pc, work, cluster, eff = s.model, s.parallel, s.work, s.cluster, s.efficiency
    tokens = s.tokens
    lins = kernels.layer_linears(model, pc.tp).values()
    f = sum(kernels.matmul_seconds(tokens, d_out, d_in, cluster) for d_in, d_out in lins)
    b = sum(kernels.matmul_seconds(tokens, d_in, d_out, cluster) for d_in, d_out in lins)
    w = sum(kernels.matmul_seconds(d_in, d_out, tokens, cluster) for d_in, d_out in lins)
    att = kernels.attention_seconds(model, tokens, work.seq_len, pc.cp, pc.tp, cluster,
                                    eff.attention, pc.cp_impl)
    ew = kernels.elementwise_seconds(model, tokens, pc.tp, pc.sp, cluster, eff.elementwise)
    if s.microbatches > 1:     # gradient accumulation into fp32, as compute_seconds
        w += kernels.stream_seconds(kernels.layer_params(model, pc.tp) * 10.0, cluster)
    head_f, head_b = kernels.linear_seconds(tokens, model.dim, model.vocab_size / pc.tp, cluster)
    loss = kernels.cross_entropy_seconds(tokens, model.vocab_size / pc.tp, cluster, eff.cross_entropy)
    extra = att / 3 if work.recompute == "selective" else 0.0
    # a mixture of experts' blocks, at their share: each GEMM's three passes equal, the
    # permutes' backward twice the forward
    moe, share = experts.block_seconds(s), moe_share(model)
    f += share * (moe.matmul + moe.elementwise) / 3
    b += share * (moe.matmul + 2 * moe.elementwise) / 3
    w += share * moe.matmul / 3
    return Passes(F=f + att / 3 + ew / 3, B=b + 2 * att / 3 + 2 * ew / 3 + extra, W=w,
                  head_F=head_f + loss / 3, head_B=head_b + 2 * loss / 3,
                  optimizer=optimizer_seconds(s))


def pace_stage(split: list[tuple[float, float]], per_layer: float,
               head: float) -> tuple[float, float]:
    """(layers, head share) of the pipeline rank with the most seconds of compute among the
    ranks' (layers, head share) `split` (`workload.stage_loads`): in a pipeline every rank
    waits for the slowest."""
    return max(split, key=lambda s: s[0] * per_layer + s[1] * head)


def moe_share(model: ModelConfig) -> float:
    """The share of the model's blocks that are mixture-of-experts (0 for a dense model):
    a pipeline rank's blocks are counted at the model's share."""
    return flops.moe_layer_count(model, range(model.n_layers)) / model.n_layers


@dataclass(frozen=True)
class Microbatch:
    """Seconds of one micro-batch on one GPU: its compute (and the attention part of it),
    the exposed TP and CP traffic on its critical path, and the pipeline's balance."""

    compute: float
    attention: float
    tp: float
    cp: float
    balance: float
    ep: float = 0.0           # expert parallelism's all-to-alls, exposed

    @property
    def critical(self) -> float:
        """On the critical path: compute and the TP, CP and EP traffic nothing hides."""
        return self.compute + self.tp + self.cp + self.ep


def microbatch_seconds(s: Scenario) -> Microbatch:
    """One micro-batch of a balanced pipeline (`Microbatch`): the first and last stage's
    extras, embedding, head and loss, spread over the pp ranks."""
    pc, h, act, tokens = s.parallel, s.model.dim, s.precision.act_bytes, s.tokens
    c = compute_seconds(s)
    # the layers recomputed in full send their forward's TP and CP traffic twice, the others
    # once: each kind priced as its own step (`by_recompute`)
    t_att = c.attention / c.layers if c.layers else 0.0    # a stage of the head alone
    t_tp = per_layer_kind(s, c, lambda x: tp_exposed_seconds(x, c.linears))
    ends = (tp_embedding_bytes(tokens, h, pc.tp, act, pc.sp) + tp_head_bytes(tokens, h, pc.tp, act)
            + tp_cross_entropy_bytes(tokens, pc.tp)) / pc.pp
    t_tp += s.seconds(ends, "tp", "all_reduce", 5 / pc.pp)
    t_cp = per_layer_kind(s, c, lambda x: cp_seconds(x, t_att))
    t_ep = experts.ep_terms(s, c.layers * moe_share(s.model), c.seconds).exposed
    return Microbatch(c.seconds, c.attention, t_tp, t_cp, c.balance, t_ep)


def per_layer_kind(s: Scenario, c: Compute, seconds) -> float:
    """`seconds(step)` of one layer, times the pace rank's layers. With --recompute-layers the
    layers recomputed in full (`c.recomputed`) send their forward's TP and CP traffic twice,
    the others once: each kind priced as a step of its own."""
    if s.work.recompute_layers is None:
        return c.layers * seconds(s)
    plain = replace(s, work=replace(s.work, recompute="none", recompute_layers=None))
    again = replace(s, work=replace(s.work, recompute_layers=None))
    return (c.layers - c.recomputed) * seconds(plain) + c.recomputed * seconds(again)


@dataclass(frozen=True)
class DataParallel:
    """Data parallelism's side of one step (`dp_terms`), in seconds."""

    reduce_scatter: float     # one reduce-scatter of the rank's gradients
    all_gather: float         # one all-gather of its weights
    drain: float              # the idle drain an interleaved pipeline lends
    late: float               # how late the first backward comes
    pp_nic: float             # the pipeline's sends on the same NIC
    exposed: float            # what sticks out of the step
    units: int = 1            # ZeRO-3's units on the rank (its layers), each gathered alone


def dp_terms(s: Scenario, t_mb: float) -> DataParallel:
    """Each term `dp_exposed_seconds` weighs, for micro-batches of `t_mb` seconds."""
    pc = s.parallel
    t_rs, t_ag = dp_collective_seconds(s, param_total_local(s.model, pc.tp) / pc.pp)
    if s.model.is_moe:      # the routed experts: reduced over the ranks that hold the same ones
        e_rs, e_ag = dp_collective_seconds(s, expert_total_local(s.model, pc.tp, pc.ep) / pc.pp,
                                           pc.dp * pc.cp // pc.ep)
        t_rs, t_ag = t_rs + e_rs, t_ag + e_ag
    naive = pc.bucket_mb == 0 and pc.zero < 3
    drain = pipeline_drain_seconds(pc.pp, pc.virtual_stages, t_mb)
    late = first_backward_delay(pc.pp, pc.virtual_stages, t_mb)
    pp_nic = pipeline_nic_seconds(s)
    units = max(1, -(-s.model.n_layers // pc.pp))      # ZeRO-3 gathers one layer at a time
    exposed = dp_exposed_seconds(pc.zero, naive, s.microbatches, t_rs, t_ag, t_mb, drain, late,
                                 pp_nic, units)
    return DataParallel(t_rs, t_ag, drain, late, pp_nic, exposed, units)


@dataclass(frozen=True)
class Extras:
    """Seconds paid once per step (`step_extras`)."""

    dp: float                 # the exposed DP traffic
    tp_norms: float           # SP's norm-gradient all-reduce
    optimizer: float          # the update of the rank's share

    @property
    def seconds(self) -> float:
        return self.dp + self.tp_norms + self.optimizer


def optimizer_seconds(s: Scenario) -> float:
    """The optimizer's update of the rank's parameters (ZeRO shards it over the dp x cp group)."""
    pc = s.parallel
    shards = pc.dp * pc.cp if pc.zero >= 1 else 1
    params = param_total_local(s.model, pc.tp) / pc.pp / shards
    if s.model.is_moe:      # the rank's routed experts, sharded over the expert-data-parallel ranks
        params += expert_total_local(s.model, pc.tp, pc.ep) / pc.pp / max(1, shards // pc.ep)
    return kernels.optimizer_seconds(params, s.cluster)


def step_extras(s: Scenario, t_mb: float) -> Extras:
    """The exposed DP traffic (`dp_terms`), SP's norm-gradient all-reduce (once per step,
    after the micro-batches) and the optimizer's update (`optimizer_seconds`)."""
    pc, norms = s.parallel, 0.0
    if pc.sp:
        nbytes = tp_norm_bytes(round(s.model.n_layers / pc.pp), False, s.model.dim, pc.tp,
                               s.precision.grad_bytes)
        norms = s.seconds(nbytes, "tp", "all_reduce", 1)
    return Extras(dp_terms(s, t_mb).exposed, norms, optimizer_seconds(s))


def pipeline_nic_seconds(s: Scenario) -> float:
    """Seconds the pipeline's sends of one step (`wire.pipeline_bytes`: an activation
    forward and a gradient back, per micro-batch and chunk, on the busiest rank) keep a
    rank's NIC busy, when its pipeline neighbours sit in other servers (a model copy of
    tp x cp GPUs fills them): the NIC that DP's reductions use too."""
    pc = s.parallel
    if pc.pp == 1 or pc.tp * pc.cp < s.cluster.gpus_per_node:
        return 0.0
    busiest = max(pipeline_bytes(s.model, pc, s.work, s.precision, stage) for stage in range(pc.pp))
    return s.seconds(busiest, "pp", "send", busiest / p2p_message_bytes(s))


def recomputed_share(model: ModelConfig, pc: ParallelConfig, work: Workload) -> float:
    """The share of the model's layers recomputed in full, over every pipeline rank and chunk
    (`Workload.recomputed_layers`)."""
    counts = stage_layer_counts(model.n_layers, pc.pp * pc.virtual_stages)
    return work.recomputed_layers(counts) / model.n_layers


def step_estimate(s: Scenario) -> Estimate:
    """The step of `s`: m micro-batches stretched by the bubble, the pipeline's exposed
    sends, and what is paid once per step; MFU and the rest follow."""
    model, pc, work, cluster = s.model, s.parallel, s.work, s.cluster
    gpus, peak, m = pc.world_size, cluster.peak_flops, s.microbatches
    mb = microbatch_seconds(s)
    t_mb = mb.critical
    bubble = bubble_fraction(pc.schedule, pc.pp, m, pc.virtual_stages)
    # the bubble stretches the step: bubble / (1 - bubble) of the micro-batches' time, that of
    # the mean rank (the fill and drain pass through all of them), m of the pace rank's
    t_pipeline = m * t_mb * (1 + bubble / (1 - bubble) * mb.balance)
    t_pp = p2p_exposed_seconds(s, t_mb)
    extra = step_extras(s, t_mb)
    step = t_pipeline + t_pp + extra.seconds
    mfu = flops.mfu(work.tokens / step, model, work.seq_len, peak, gpus)
    hfu = flops.hfu(work.tokens / step, model, work.seq_len, peak, gpus, work.recompute)
    if work.recompute_layers is not None:    # only some layers redo their forward: their share
        share = recomputed_share(model, pc, work)
        hfu = mfu + share * (hfu - mfu)
    gb = {k: v / 1e9 for k, v in memory_per_gpu(model, pc, work, s.precision).items()}
    breakdown = {"compute": m * mb.compute, "tp": m * mb.tp + extra.tp_norms, "cp": m * mb.cp,
                 "bubble": t_pipeline - m * t_mb, "pp": t_pp, "dp": extra.dp,
                 "optimizer": extra.optimizer}
    ep = {}
    if model.is_moe:        # a dense run's report keeps its keys
        breakdown["ep"] = m * mb.ep
        c = compute_seconds(s)
        ep = experts.ep_report(experts.ep_terms(s, c.layers * moe_share(model), c.seconds), s, m)
    return Estimate(
        mfu=mfu, hfu=hfu, tflops_per_gpu=mfu * cluster.peak_tflops,
        step_time_s=step, memory_gb_per_gpu=gb["total"],
        comm_bytes_per_gpu=comm_bytes_per_gpu(model, pc, work, s.precision),
        bubble_fraction=bubble,
        time_breakdown_s=breakdown,
        memory_breakdown_gb={k: gb[k] for k in ("params", "grads", "optimizer", "activations")},
        fits_memory=gb["total"] <= cluster.hbm_gb, microbatches=m,
        tokens_per_s=work.tokens / step, parallel=pc, workload=work, ep=ep)


def wire_seconds(e: Estimate, axis: str, cluster: Cluster,
                 efficiency: Efficiency = LLAMA3_EFFICIENCY) -> float:
    """Seconds pipeline rank 0's bytes of `axis` (`e.comm_bytes_per_gpu`) take at its group's
    bandwidth: the time each axis would cost if nothing overlapped it."""
    return axis_seconds(e.comm_bytes_per_gpu[axis], axis, e.parallel, cluster, efficiency.links)
