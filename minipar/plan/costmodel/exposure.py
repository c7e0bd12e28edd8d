"""What each axis's communication costs the step: the part no computation hides.

Chapter "Four dimensions at once". A collective's time is the alpha-beta model of
`hardware.axis_seconds`; what the step pays is what sticks out of the work it overlaps:

* TP: every collective sits between two matmuls that need it, so plain TP exposes all of
  it. `--tp-overlap` (collective matmul) cuts each SP all-gather / reduce-scatter into t-1
  ring steps, each hidden behind 1/t of the matmul it feeds: exposed max(0, c - M (t-1)/t).
* CP: the ring sends the next K/V block while this block's attention runs; the all-gather
  (Llama 3's) and Ulysses' all-to-alls are waited for.
* PP: p v - 1 sends each way while the pipeline fills and drains (one per stage boundary);
  in the steady state a send hides behind the next chunk unless it is slower.
* DP: gradients are final only during the last micro-batch's backward (in an interleaved
  pipeline, the later chunks' already during the drain), updated weights are needed by
  the first forward (ZeRO-2/3 reduce or gather every micro-batch).
"""
from __future__ import annotations

from .scenario import Scenario
from ..formulas.collectives import wire_bytes
from ..formulas.context_parallel import cp_hops, cp_kv_bytes, cp_layer_bytes, ulysses_kv_heads
from ..formulas.tensor_parallel import tp_layer_bytes

# The collectives of one block under SP, in order, each with the linear it feeds (all-gather)
# or drains (reduce-scatter); the backward runs them reversed, beside the input-gradient GEMMs.
TP_PAIRS = ("qkv", "o", "gate_up", "down")


def tp_ops(s: Scenario) -> int:
    """All-reduces of one block's forward and backward (2 + 2), and the recomputed forward's
    2 under full recomputation."""
    return 4 + (2 if s.work.recompute == "full" else 0)


def tp_collective_seconds(s: Scenario) -> float:
    """One of a block's TP collectives on one micro-batch: an all-gather or reduce-scatter
    of the [tokens, dim] activations under SP, or half of an all-reduce without it."""
    pc, n_ops = s.parallel, tp_ops(s)
    nbytes = tp_layer_bytes(s.tokens, s.model.dim, pc.tp, s.precision.act_bytes, s.work.recompute, pc.sp)
    op = "all_gather" if pc.sp else "all_reduce"
    calls = 2 * n_ops if pc.sp else n_ops          # SP: AG + RS for each all-reduce
    return s.seconds(nbytes, "tp", op, calls) / (2 * n_ops)


def tp_exposed_seconds(s: Scenario, matmuls: dict[str, tuple[float, float]]) -> float:
    """Exposed TP seconds of one block and micro-batch; `matmuls`: {linear: (forward,
    backward)} seconds (`kernels.layer_matmul_seconds`)."""
    pc, c, n_ops = s.parallel, tp_collective_seconds(s), tp_ops(s)
    if not (pc.tp_overlap and pc.sp):
        return 2 * n_ops * c
    hide = (pc.tp - 1) / pc.tp
    forward = sum(max(0.0, c - hide * matmuls[k][0]) for k in TP_PAIRS)
    backward = sum(max(0.0, c - hide * matmuls[k][1] / 2) for k in TP_PAIRS)
    return forward * (2 if s.work.recompute == "full" else 1) + backward


def cp_seconds(s: Scenario, t_attention: float) -> float:
    """Exposed CP seconds of one block and micro-batch (`t_attention`: its attention core)."""
    pc, model, recompute = s.parallel, s.model, s.work.recompute
    if pc.cp == 1:
        return 0.0
    kv_heads, q_heads = model.n_kv_heads // pc.tp, model.n_heads // pc.tp
    if pc.cp_impl == "ulysses":
        kv_heads = ulysses_kv_heads(kv_heads, pc.cp)
        kv = cp_kv_bytes(s.tokens, kv_heads, model.head_dim, s.precision.act_bytes)
        nbytes = cp_layer_bytes(kv, pc.cp, "ulysses", recompute, q_heads // kv_heads)
        passes = 3 if recompute == "full" else 2
        return s.seconds(nbytes, "cp", "all_to_all", 3 * passes)
    kv = cp_kv_bytes(s.tokens, kv_heads, model.head_dim, s.precision.act_bytes)
    nbytes = cp_layer_bytes(kv, pc.cp, pc.cp_impl, recompute)
    if pc.cp_impl == "allgather":
        calls = 2 + (1 if recompute == "full" else 0)
        return s.seconds(nbytes, "cp", "all_gather", calls)
    hops = cp_hops(pc.cp, "ring", recompute)
    t = s.seconds(nbytes, "cp", "send", hops)
    return max(0.0, t - t_attention)        # K,V of the next block travel meanwhile


def p2p_message_bytes(s: Scenario) -> float:
    """One pipeline send: a micro-batch's [tokens, dim] activations (or their gradient),
    1/tp of them under sequence parallelism."""
    pc = s.parallel
    return s.tokens * s.model.dim * s.precision.act_bytes / (pc.tp if pc.sp else 1)


def p2p_exposed_seconds(s: Scenario, t_mb: float) -> float:
    """Pipeline transfers that stick out: one per stage boundary each way while the pipeline
    fills and drains (the first micro-batch crosses all p v - 1 boundaries of the model
    before the last stage can start: interleaving multiplies the hops, as the replay of a
    recorded run shows); in between, a send hides behind the next chunk's compute unless it
    is slower, or unless the stack waits for each batch of sends (`Efficiency.p2p_overlap`
    off): then every one is on the critical path."""
    pc = s.parallel
    if pc.pp == 1:
        return 0.0
    t_p2p = s.seconds(p2p_message_bytes(s), "pp", "send", 1)
    chunk = t_mb / pc.virtual_stages
    hops = pc.pp * pc.virtual_stages - 1
    steady = max(0.0, t_p2p - chunk) if s.efficiency.p2p_overlap else t_p2p
    return 2 * hops * t_p2p + 2 * s.microbatches * pc.virtual_stages * steady


def dp_exposed_seconds(zero: int, naive: bool, microbatches: int, t_rs: float, t_ag: float,
                       t_mb: float, drain: float = 0.0, late: float = 0.0,
                       shared: float = 0.0, units: int = 1) -> float:
    """DP time that sticks out of the step. Gradients are final only during the last
    micro-batch's backward (2/3 of its time), so that is all a reduction can hide behind,
    plus `drain` (`pipeline_drain_seconds`); the updated weights can be prefetched during
    the first forward (1/3). ZeRO-2 reduces every micro-batch (its gradients are sharded):
    m reduce-scatters, hidden by all the compute from the first backward to the last, which
    in a pipeline starts `late` (`first_backward_delay`) and shares the NIC with the
    pipeline's sends (`shared` seconds of them). ZeRO-3 gathers the weights every time, unit
    by unit (`units` of them on the rank): `zero3_exposed_seconds`.
    Naive DP (no buckets) overlaps nothing."""
    backward, forward = (0.0, 0.0) if naive else (2 / 3 * t_mb + drain, 1 / 3 * t_mb)

    def exposed(t, window):
        return max(0.0, t - window)
    m = microbatches
    if zero == 0:
        return exposed(2 * t_rs, backward)           # an all-reduce: reduce-scatter + all-gather
    if zero == 1:
        return exposed(t_rs, backward) + exposed(t_ag, forward)
    if zero == 2:     # each micro-batch's reduce-scatter runs on NCCL's stream behind
        # everything computed after it; only the last one must end before the update
        return exposed(m * t_rs + shared, (m - 1) * t_mb + backward - late) + exposed(t_ag, forward)
    return zero3_exposed_seconds(units, m, t_ag, t_rs, t_mb / 3, 2 * t_mb / 3)


def zero3_exposed_seconds(units: int, microbatches: int, t_ag: float, t_rs: float,
                          t_forward: float, t_backward: float) -> float:
    """What ZeRO-3's traffic adds to the step, from its mechanism.

    ZeRO-3 (FSDP's FULL_SHARD, DeepSpeed stage 3) keeps 1/n of every weight on each GPU.
    A unit's weights (a transformer layer: FSDP wraps each block; DeepSpeed fetches each
    module's parameters) are all-gathered just before the unit computes and freed after,
    so every micro-batch gathers the whole model twice, once for the forward and once for
    the backward, and reduce-scatters every gradient once (DeepSpeed reduces each
    micro-batch's gradients into the sharded fp32 buffer: no full-size gradient is kept).
    What hides the traffic is prefetching, one unit ahead:

    * forward: PyTorch's FSDP notes ("FSDP Prefetch Nuances") say unit i+1's all-gather,
      issued on its own CUDA stream, overlaps unit i's forward compute, and that "the 1st
      all-gather will not be able to overlap with anything". DeepSpeed prefetches in trace
      order up to stage3_prefetch_bucket_size parameter elements (5e7; "Maximum number of
      parameter elements to fetch ahead of use", runtime/zero/config.py), at least the next
      module, holding at most stage3_max_live_parameters (1e9) gathered: a layer of a large
      model is over 5e7 elements, so it too works one unit ahead.
    * backward: FSDP's BackwardPrefetch.BACKWARD_PRE (torch/distributed/fsdp/api.py)
      "overlaps the next all-gather and the current gradient computation"; the unit's
      reduce-scatter follows its gradient computation and hides behind the next units'.
      The gather of unit i-1 and the reduce-scatter of unit i+1 run during unit i's
      backward on the same link (across servers: the same NICs), so their times add.

    Per micro-batch, with U units of forward compute f and backward compute b each, and
    each unit's all-gather ag = t_ag / U and reduce-scatter rs = t_rs / U:

        forward  exposed = ag + (U - 1) max(0, ag - f)           first gather, then what
        backward exposed = ag + rs + (U - 1) max(0, ag + rs - b)  the comm outlasts compute

    the backward's first gather (the units come back in reverse) and its last reduce-scatter
    (nothing is computed after it) hide behind nothing. When the comm outlasts the compute
    the micro-batch takes f + b + U (2 ag + rs): every byte of the link's traffic plus one
    unit's compute, whatever the batch per GPU; when it does not, only the first gathers
    and the last reduce-scatter stick out. `t_ag`, `t_rs`: one all-gather / reduce-scatter
    of all the rank's parameters (`dp_collective_seconds`); `t_forward`, `t_backward`: one
    micro-batch's compute. One unit (`units=1`) hides nothing."""
    u = max(1, units)
    ag, rs, f, b = t_ag / u, t_rs / u, t_forward / u, t_backward / u
    forward = ag + (u - 1) * max(0.0, ag - f)
    backward = ag + rs + (u - 1) * max(0.0, ag + rs - b)
    return microbatches * (forward + backward)


def first_backward_delay(pp: int, v: int, t_mb: float) -> float:
    """How much later than its first forward's end the first backward of pipeline rank 0
    starts, less the pipeline's idle time (the reductions can use that): micro-batch 0 goes
    forward through all p v chunks (p t_mb / 3 of forward work) and back through p - 1 of
    them (2 t_mb / 3v each) before rank 0 has a gradient to reduce; the bubble, (p-1) t_mb / v,
    is idle time the NIC can work in. Nothing for a single stage; for plain 1F1B the two
    cancel."""
    if pp == 1:
        return 0.0
    warmup = (pp - 1) * t_mb / 3 + (pp - 1) * 2 * t_mb / (3 * v)
    return max(0.0, warmup - (pp - 1) * t_mb / v)


def pipeline_drain_seconds(pp: int, v: int, t_mb: float) -> float:
    """Extra time to hide DP's reduction in an interleaved pipeline: a rank's later chunks
    finish their last backward while the pipeline drains, so their gradients' reduction
    runs in the drain's idle time, about half the bubble, (p-1) t_mb / (2v), all chunks but
    the first. A plain 1F1B rank has one chunk: its gradients are final only at its very
    last backward, and nothing is gained."""
    if pp == 1 or v == 1:
        return 0.0
    return (v - 1) / v * (pp - 1) * t_mb / (2 * v)


def dp_collective_seconds(s: Scenario, params: float, n: int | None = None) -> tuple[float, float]:
    """(reduce-scatter of the gradients, all-gather of the weights) of `params` parameters
    over the dp x cp group (or `n` of its ranks: a mixture of experts' routed experts are
    replicated over dp x cp / ep), in buckets of --bucket-mb (each bucket one collective)."""
    pc = s.parallel
    n = pc.dp * pc.cp if n is None else n
    grad_bytes = params * s.precision.reduce_bytes
    buckets = max(1.0, grad_bytes / (pc.bucket_mb * 1e6)) if pc.bucket_mb > 0 else 1.0
    if pc.zero == 0:     # one all-reduce (a tree across servers), counted as 2 x t_rs
        ar = wire_bytes("all_reduce", n, int(grad_bytes))
        return s.seconds(ar, "dp", "all_reduce", buckets) / 2, 0.0
    rs = wire_bytes("reduce_scatter", n, int(grad_bytes))
    ag = wire_bytes("all_gather", n, int(params * s.precision.param_bytes))
    return (s.seconds(rs, "dp", "reduce_scatter", buckets),
            s.seconds(ag, "dp", "all_gather", buckets))
