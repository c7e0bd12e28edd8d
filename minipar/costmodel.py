"""A cost model of one training step: time, memory and bytes on the wire, from first principles.

Given a model, a layout (`ParallelConfig`), a cluster and a batch, `estimate` predicts what a
real run would measure: MFU, TFLOP/s per GPU, step time, memory per GPU and the bytes each
GPU sends per step on each axis. Everything is a pure function; nothing here starts a process
or imports torch, so the book, the widgets and the CLI can ask thousands of what-ifs.

The step time of one GPU is built up as

    t_mb     = compute of one micro-batch through the rank's layers
               + its tensor-parallel all-reduces (exposed: nothing overlaps them)
               + its context-parallel K/V traffic (all-gather: exposed; ring: hidden behind
                 the attention blocks unless it is slower than them)
    pipeline = m * t_mb / (1 - bubble)          (bubble: closed form of the schedule)
    step     = pipeline + exposed p2p (the fill and drain) + exposed DP traffic

DP traffic overlaps with compute only where its data exists: the gradients are final during
the last micro-batch's backward, and the updated parameters are needed by the first forward.

Compute time uses two efficiency constants, network time one (`Efficiency`): ONE set, the
same for every row of Llama 3's Table 4, justified in the book (chapter "MFU and
communication volume"). The bytes follow minipar's own implementation, so that a tiny gloo
run's CommLog can be compared with them number for number (`comm_bytes_per_gpu`).

Bytes convention (as `minipar.comm`): what one rank puts on the wire under the ring
algorithm: all-reduce 2(n-1)/n S, all-gather and reduce-scatter (n-1)/n S (S = the full
tensor), send S on the sender.

Run `python -m minipar.costmodel --help`.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import asdict, dataclass, field, replace

from . import flops
from .config import SCHEDULES, ConfigError, ModelConfig, ParallelConfig

RECOMPUTE = flops.RECOMPUTE
TABLE4_BATCH_TOKENS = 2048 * 8192          # "16M tokens per batch": 2048 sequences of 8K


# ============================================================================ the hardware
@dataclass(frozen=True)
class Cluster:
    """What one GPU can do and how the GPUs are wired.

    Bandwidths are per GPU and per direction, as the data sheets give them (NVLink 4: 900
    GB/s bidirectional = 450 each way; one 400 Gb/s NIC per GPU = 50 GB/s). The network is a
    hierarchy: GPUs in a server (NVLink), servers in a rack (one switch), racks in a pod
    (full bisection), pods in the cluster (the pod's uplinks are 1/`pod_oversubscription`
    of what its GPUs could send).
    """

    name: str = "custom"
    peak_tflops: float = 989.0          # dense bf16 per GPU
    hbm_gb: float = 80.0
    gpus_per_node: int = 8
    intra_node_GBps: float = 450.0      # NVLink, per GPU per direction
    inter_node_Gbps: float = 400.0      # RoCE / InfiniBand NIC, per GPU
    gpus_per_rack: int = 16
    pod_size: int = 3072
    pod_oversubscription: float = 7.0
    n_gpus: int = 24576

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def inter_node_GBps(self) -> float:
        return self.inter_node_Gbps / 8

    def problems(self) -> list[str]:
        out = []
        for flag, value in (("--peak-tflops", self.peak_tflops), ("--hbm-gb", self.hbm_gb),
                            ("--gpus-per-node", self.gpus_per_node),
                            ("--intra-node-GBps", self.intra_node_GBps),
                            ("--inter-node-Gbps", self.inter_node_Gbps)):
            if not value > 0:
                out.append(f"{flag} {value} must be positive")
        return out


# Llama 3 (Dubey et al. 2024, section 3.3.1): H100 SXM at 700 W with 80 GB HBM3, 8 per
# server on NVLink, one 400 Gb/s RoCE NIC per GPU, racks of 16 GPUs (two servers), pods of
# 3,072 GPUs with full bisection bandwidth, 1:7 oversubscription between the 8 pods.
LLAMA3_CLUSTER = Cluster(name="llama3 (H100 SXM, 24K)", peak_tflops=989.0, hbm_gb=80.0,
                         gpus_per_node=8, intra_node_GBps=450.0, inter_node_Gbps=400.0,
                         gpus_per_rack=16, pod_size=3072, pod_oversubscription=7.0,
                         n_gpus=24576)


# ============================================================================ the constants
@dataclass(frozen=True)
class Efficiency:
    """The only three numbers the model does not derive. One set for every configuration.

    dense:     fraction of peak reached by a layer's weight matmuls *together with* the
               memory-bound kernels between them (norms, SwiGLU, RoPE, residual adds, casts)
               and everything else this model ignores (launch gaps, stragglers, the
               optimizer step). A large bf16 GEMM on a 700 W H100 sustains ~65-75% of the
               989 TFLOP/s data-sheet number; the rest of a layer costs a quarter of that.
    attention: fraction of peak reached by the fused (flash) attention kernels, forward and
               backward, on the FLOPs they really do: half the s x s square under a causal
               mask. FlashAttention-2 reports up to 335 TFLOP/s on H100 (no Hopper-specific
               instructions), counting its backward as 2.5 forwards: ~0.29 of peak in our
               1 + 2 counting, before document masks and the power cap.
    network:   fraction of a link's bandwidth a collective achieves (nccl-tests' "bus
               bandwidth" over the link rate: ~360 of 450 GB/s on NVLink, ~40 of 50 GB/s on
               400G RoCE).
    """

    dense: float = 0.52
    attention: float = 0.22
    network: float = 0.8


LLAMA3_EFFICIENCY = Efficiency()
CAUSAL_FRACTION = 0.5       # a causal kernel computes half of the s x s square


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a GPU stores and sends."""

    param_bytes: int = 2        # the weights the matmuls read (and ZeRO all-gathers)
    grad_bytes: int = 4         # gradients as accumulated and reduced
    act_bytes: int = 2          # activations, and what TP, CP and PP send
    optimizer_bytes: int = 12   # per parameter: Adam's m and v (+ fp32 master weights)


# Llama 3: bf16 weights and activations; "FP32 gradient accumulation during backward
# computation over multiple micro-batches and also reduce-scatter gradients in FP32"
# (section 3.3.2); fp32 master weights and Adam moments.
BF16_MIXED = Precision(param_bytes=2, grad_bytes=4, act_bytes=2, optimizer_bytes=12)
# minipar on CPU: everything float32, Adam's two moments, no separate master copy.
FP32 = Precision(param_bytes=4, grad_bytes=4, act_bytes=4, optimizer_bytes=8)
PRECISIONS = {"bf16": BF16_MIXED, "fp32": FP32}


# ============================================================================ bytes on the wire
def ring_bytes(op: str, n: int, size: int) -> int:
    """Bytes one rank sends for `op` over n ranks on a tensor of `size` bytes (ring), rounded
    down as `minipar.comm.wire_bytes` does (once per collective call)."""
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1) * size // n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * size // n
    if op == "send":
        return size
    raise ValueError(f"unknown collective {op!r}")


def dp_bytes(n_params: int, n: int, zero: int, microbatches: int = 1,
             grad_bytes: int = 4, param_bytes: int = 4) -> int:
    """Data-parallel bytes one GPU sends per step, over the dp x cp group of size n.

    n_params: the parameters this rank holds (its TP shard of its pipeline stage).
      zero 0  all-reduce the accumulated gradients once, after the last micro-batch:
              2(n-1)/n G
      zero 1  reduce-scatter them once, update my shard, all-gather the parameters:
              (n-1)/n G + (n-1)/n P
      zero 2  as 1, but reduce-scatter after *every* micro-batch (no full gradient is kept):
              m (n-1)/n G + (n-1)/n P
      zero 3  per micro-batch: all-gather the parameters for the forward, again for the
              backward, reduce-scatter the gradients: m [2 (n-1)/n P + (n-1)/n G]
    with G = n_params * grad_bytes, P = n_params * param_bytes (equal on CPU: float32).
    minipar pads every tensor to a multiple of n for ZeRO >= 1; pass the padded count
    (`zero_padded_numel`) to match its CommLog to the byte.
    """
    g, p, m = n_params * grad_bytes, n_params * param_bytes, microbatches
    if zero == 0:
        return ring_bytes("all_reduce", n, g)
    if zero == 1:
        return ring_bytes("reduce_scatter", n, g) + ring_bytes("all_gather", n, p)
    if zero == 2:
        return m * ring_bytes("reduce_scatter", n, g) + ring_bytes("all_gather", n, p)
    if zero == 3:
        return m * (2 * ring_bytes("all_gather", n, p) + ring_bytes("reduce_scatter", n, g))
    raise ConfigError(f"--zero {zero} is unknown; choose 0, 1, 2 or 3")


def zero_padded_numel(numels, n: int) -> int:
    """Elements ZeRO moves for tensors of `numels` elements: each padded to a multiple of n."""
    return sum(math.ceil(k / n) * n for k in numels)


def tp_layer_bytes(tokens: int, dim: int, tp: int, act_bytes: int, recompute: str = "none") -> int:
    """Tensor-parallel bytes of one transformer layer for one micro-batch of `tokens` tokens.

    Megatron's layout: column-parallel in (q, k, v; gate, up), row-parallel out (o; down).
    Forward: an all-reduce of the [tokens, dim] output after o and after down (g).
    Backward: an all-reduce of the input gradient before q, k, v and before gate, up (f).
    So 4 all-reduces of tokens * dim elements. Sequence parallelism replaces each all-reduce
    by an all-gather plus a reduce-scatter of the same tensor: the same bytes.
    Full recomputation runs the forward again: 2 more.
    """
    n_ops = 4 + (2 if recompute == "full" else 0)
    return n_ops * ring_bytes("all_reduce", tp, tokens * dim * act_bytes)


def tp_embedding_bytes(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool = False) -> int:
    """The vocab-parallel embedding (first stage): each rank looks up the tokens in its slice
    of the vocabulary (zeros elsewhere), and the [tokens, dim] results are summed: one
    all-reduce forward (g), nothing backward. With sequence parallelism the sum is a
    reduce-scatter, whose backward all-gathers the gradient (every rank's slice of the table
    needs all tokens' gradients): the same bytes either way."""
    size = tokens * dim * act_bytes
    if sp:
        return ring_bytes("reduce_scatter", tp, size) + ring_bytes("all_gather", tp, size)
    return ring_bytes("all_reduce", tp, size)


def tp_head_bytes(tokens: int, dim: int, tp: int, act_bytes: int) -> int:
    """The column-parallel output head (last stage): its input is copied to every rank, so
    the backward all-reduces the input gradient (f). With sequence parallelism: all-gather
    forward + reduce-scatter backward, the same bytes."""
    return ring_bytes("all_reduce", tp, tokens * dim * act_bytes)


def tp_norm_bytes(layers: int, last: bool, dim: int, tp: int, grad_bytes: int) -> int:
    """Sequence parallelism only: each rank's RMSNorm sees only its slice of the tokens, so
    the gradient of a (replicated) norm weight is a partial sum, all-reduced every
    micro-batch: two norms per layer, plus the final one on the last stage."""
    return (2 * layers + (1 if last else 0)) * ring_bytes("all_reduce", tp, dim * grad_bytes)


def tp_cross_entropy_bytes(tokens: int, tp: int) -> int:
    """The vocab-parallel cross-entropy (last stage) never gathers the logits: three
    all-reduces of one float32 per token, the max logit (for a stable exp), the sum of
    exponentials and the target's logit (which lives on one rank only)."""
    return 3 * ring_bytes("all_reduce", tp, tokens * 4)


def pp_bytes(tokens: int, dim: int, pp: int, microbatches: int, act_bytes: int,
             stage: int = 0, virtual_stages: int = 1, sp_tp: int = 1) -> int:
    """Pipeline bytes pipeline rank `stage` sends per step.

    Per micro-batch and model chunk: the activations [tokens, dim] forward to the next stage,
    their gradient backward to the previous one; no send from the last global stage forward
    or from the first one backward. With sequence parallelism (`sp_tp` = tp) the residual
    stream is already split over the TP ranks, and each sends only its 1/tp.
    """
    if pp == 1:
        return 0
    v = virtual_stages
    forward_sends = v - (1 if stage == pp - 1 else 0)
    backward_sends = v - (1 if stage == 0 else 0)
    size = tokens * dim * act_bytes // sp_tp
    return microbatches * (forward_sends + backward_sends) * ring_bytes("send", pp, size)


def cp_kv_bytes(tokens: int, kv_heads: int, head_dim: int, act_bytes: int) -> int:
    """One rank's K and V for one layer: 2 tokens x kv_heads x head_dim, GQA not expanded
    (kv_heads is the rank's share: n_kv_heads / tp)."""
    return 2 * tokens * kv_heads * head_dim * act_bytes


def cp_layer_bytes(kv: int, cp: int, impl: str = "ring", recompute: str = "none") -> int:
    """Context-parallel bytes of one layer and micro-batch; `kv` = `cp_kv_bytes` of a rank.

    ring:      forward, the K,V blocks go round the ring: cp-1 sends of kv. Backward, they go
               round again (not stored: that would be the whole sequence's K,V) with the dK,dV
               accumulators; an accumulator starts one rank downstream of its block's owner,
               so cp-1 hops bring it home: (cp-1) kv + (cp-1) kv.
    allgather: (Llama 3) forward, all-gather K,V: (n-1)/n of cp kv = (cp-1) kv; the gathered
               K,V are kept for the backward, which reduce-scatters dK,dV: (cp-1) kv.
    Full recomputation repeats the forward part. The load-balanced causal layout sends whole
    blocks even where the mask will discard half of one.
    """
    if cp == 1:
        return 0
    if impl == "ring":
        forward, backward = (cp - 1) * kv, 2 * (cp - 1) * kv
    elif impl == "allgather":
        forward = ring_bytes("all_gather", cp, cp * kv)
        backward = ring_bytes("reduce_scatter", cp, cp * kv)
    else:
        raise ConfigError(f"--cp-impl {impl!r} is unknown; choose ring or allgather")
    return forward * (2 if recompute == "full" else 1) + backward


# ============================================================================ who holds what
def stage_layer_counts(n_layers: int, n_stages: int) -> list[int]:
    """Transformer layers of each global pipeline stage (pp * virtual_stages of them).

    Balanced, larger first. With one or two stages more than layers, Llama 3's split: the
    first stage holds only the embedding and the last only the head and loss (405B: 126
    layers on 16 x 8 = 128 stages, one layer each in between).
    """
    if n_stages <= n_layers:
        q, r = divmod(n_layers, n_stages)
        return [q + (1 if i < r else 0) for i in range(n_stages)]
    if n_stages > n_layers + 2 or n_stages < 3:
        raise ConfigError(f"{n_stages} pipeline stages cannot hold {n_layers} layers")
    inner = stage_layer_counts(n_layers, n_stages - 2)
    return [0] + inner + [0] if n_stages == n_layers + 2 else [0] + inner


def rank_layers(model: ModelConfig, pp: int, virtual_stages: int, stage: int) -> int:
    """Layers held by pipeline rank `stage` (its chunks are global stages c*pp + stage)."""
    counts = stage_layer_counts(model.n_layers, pp * virtual_stages)
    return sum(counts[c * pp + stage] for c in range(virtual_stages))


def local_param_count(model: ModelConfig, tp: int, layers: int, first: bool, last: bool) -> int:
    """Parameters one GPU holds: `layers` blocks sharded over tp (norm gains replicated), plus
    the vocab-parallel embedding on the first stage, the final norm and head on the last."""
    h = model.dim
    block = (flops.layer_param_count(model) - 2 * h) // tp + 2 * h
    table = model.vocab_size * h // tp
    n = layers * block
    if first:
        n += table
    if last:
        n += h + (0 if model.tie_embeddings and first else table)
    return n


# ============================================================================ the workload
@dataclass(frozen=True)
class Workload:
    """A global batch of `global_batch` sequences of `seq_len` tokens, fed to each DP rank in
    micro-batches of `microbatch_size` sequences."""

    seq_len: int
    global_batch: int
    microbatch_size: int = 1
    recompute: str = "none"

    @property
    def tokens(self) -> int:
        return self.seq_len * self.global_batch

    def microbatches(self, parallel: ParallelConfig) -> int:
        return self.global_batch // (parallel.dp * self.microbatch_size)

    def tokens_per_microbatch(self, parallel: ParallelConfig) -> int:
        """Tokens one GPU processes per micro-batch: its 1/cp of each sequence."""
        return self.microbatch_size * self.seq_len // parallel.cp


def make_workload(seq_len: int, global_batch_tokens: int | None = None,
                  global_batch: int | None = None, microbatch_size: int = 1,
                  recompute: str = "none") -> Workload:
    """The batch from either --global-batch-tokens or --global-batch (sequences)."""
    if global_batch_tokens is not None and global_batch is not None:
        raise ConfigError("--global-batch-tokens and --global-batch are exclusive: give one")
    if global_batch is None:
        tokens = TABLE4_BATCH_TOKENS if global_batch_tokens is None else global_batch_tokens
        if seq_len < 1:
            raise ConfigError(f"--seq-len {seq_len} must be a positive integer")
        if tokens < 1:
            raise ConfigError(f"--global-batch-tokens {tokens} must be a positive integer")
        if tokens % seq_len:
            raise ConfigError(f"--global-batch-tokens {tokens} is not a multiple of --seq-len {seq_len}")
        global_batch = tokens // seq_len
    return Workload(seq_len, global_batch, microbatch_size, recompute)


def workload_problems(parallel: ParallelConfig, work: Workload) -> list[str]:
    """Rules of the batch itself, beyond `ParallelConfig.problems`."""
    out = []
    if work.microbatch_size < 1:
        return [f"--microbatch-size {work.microbatch_size} must be a positive integer"]
    if work.global_batch < 1:
        return [f"--global-batch {work.global_batch} must be a positive integer"]
    if work.recompute not in RECOMPUTE:
        out.append(f"--recompute {work.recompute!r} is unknown; choose one of {', '.join(RECOMPUTE)}")
    if parallel.dp >= 1 and work.global_batch % parallel.dp == 0:
        per_rank = work.global_batch // parallel.dp
        if per_rank % work.microbatch_size:
            out.append(f"--microbatch-size {work.microbatch_size} does not divide the "
                       f"{per_rank} sequences per DP rank (--global-batch {work.global_batch} / --dp {parallel.dp})")
    elif parallel.dp >= 1:
        out.append(f"--dp {parallel.dp} does not divide the global batch of {work.global_batch} sequences")
    return out


def layout_problems(model: ModelConfig, parallel: ParallelConfig, work: Workload) -> list[str]:
    """Every rule this model + layout + batch breaks, one line each (empty: all is well)."""
    out = model.problems() + workload_problems(parallel, work)
    if out:
        return out
    pp, v, n_layers = parallel.pp, parallel.virtual_stages, model.n_layers
    # A cost model does not care about trained position limits: long-context rows (131K)
    # run a model whose config says 8K.
    long_model = replace(model, max_seq_len=max(model.max_seq_len, work.seq_len))
    for line in parallel.problems(long_model, work.seq_len, work.global_batch):
        # Llama 3 puts the embedding and the head in stages of their own (`stage_layer_counts`),
        # so up to n_layers + 2 stages are fine here: that rule is replaced by the one below.
        if "stages exceeds n_layers" in line:
            continue
        if "--microbatches" in line:       # this CLI sets the micro-batch size instead
            line += (f" (micro-batches per DP rank = --global-batch {work.global_batch} / "
                     f"(--dp {parallel.dp} x --microbatch-size {work.microbatch_size}))")
        out.append(line)
    if pp * v > n_layers + 2:
        out.append(f"--pp {pp} x --virtual-stages {v} = {pp * v} stages exceeds "
                   f"n_layers + 2 = {n_layers + 2} (embedding and head may take a stage each)")
    return list(dict.fromkeys(out))


# ============================================================================ memory
def activation_elements(model: ModelConfig, tp: int, sp: bool, recompute: str) -> float:
    """Elements one GPU stores per token and layer for the backward (Korthikanti et al. 2022's
    accounting, for a Llama block with flash attention: no s x s scores are stored).

      none       x, norm(x), x2, norm(x2)         4 h   (split over tp only with SP)
                 q, k, v, attention output        2 h + 2 kv_dim   (split over tp)
                 gate, up, silu(gate) * up        3 ffn            (split over tp)
      selective  recompute the norms, the attention core and the SwiGLU product:
                 x, x2 | q, k, v | gate, up
      full       only each layer's input x (plus one layer's worth while it is recomputed)
    """
    h, kv, f = model.dim, model.n_kv_heads * model.head_dim, model.ffn_dim
    sp_t = tp if sp else 1
    if recompute == "none":
        return 4 * h / sp_t + (2 * h + 2 * kv + 3 * f) / tp
    if recompute == "selective":
        return 2 * h / sp_t + (h + 2 * kv + 2 * f) / tp
    return h / sp_t


def in_flight_microbatches(schedule: str, pp: int, microbatches: int, stage: int = 0,
                           virtual_stages: int = 1) -> float:
    """Micro-batches whose activations pipeline rank `stage` holds at its peak, in units of
    "one micro-batch through all of the rank's layers".

    afab: all m. 1f1b and zb: the p - stage forwards before the first backward. Interleaved
    (Megatron): N (v-1) + 2 (p-1-stage) + 1 chunk-forwards in flight, N = p, over v chunks:
    p + (p-1)/v on the first rank.
    """
    m, p, v = microbatches, pp, virtual_stages
    if p == 1:
        return 1
    if schedule == "afab":
        return m
    if schedule == "interleaved" and v > 1:
        chunks = min(p * (v - 1) + 2 * (p - 1 - stage) + 1, m * v)
        return chunks / v
    return min(m, p - stage)


def memory_per_gpu(model: ModelConfig, parallel: ParallelConfig, work: Workload,
                   precision: Precision = BF16_MIXED) -> dict[str, float]:
    """Bytes on the most loaded GPU: parameters, gradients, optimizer state (sharded over the
    dp x cp group by ZeRO stage) and stored activations. The stage whose total is largest
    (usually the first: most micro-batches in flight) is reported."""
    pc, n = parallel, parallel.dp * parallel.cp
    m = work.microbatches(pc)
    tokens = work.tokens_per_microbatch(pc)
    per_layer = activation_elements(model, pc.tp, pc.sp, work.recompute) * tokens * precision.act_bytes
    worst: dict[str, float] = {}
    # Layers differ by at most one between ranks (larger first) and in-flight micro-batches
    # fall with the rank, so the most loaded GPU is rank 0, rank 1 (rank 0 may hold only the
    # embedding) or the last (the head).
    for stage in sorted({0, min(1, pc.pp - 1), pc.pp - 1}):
        layers = rank_layers(model, pc.pp, pc.virtual_stages, stage)
        params = local_param_count(model, pc.tp, layers, stage == 0, stage == pc.pp - 1)
        flight = in_flight_microbatches(pc.schedule, pc.pp, m, stage, pc.virtual_stages)
        acts = flight * layers * per_layer
        if work.recompute == "full":   # one layer's full activations while it is recomputed
            acts += activation_elements(model, pc.tp, pc.sp, "none") * tokens * precision.act_bytes
        out = {
            "params": params * precision.param_bytes / (n if pc.zero >= 3 else 1),
            "grads": params * precision.grad_bytes / (n if pc.zero >= 2 else 1),
            "optimizer": params * precision.optimizer_bytes / (n if pc.zero >= 1 else 1),
            "activations": acts,
        }
        out["total"] = sum(out.values())
        if not worst or out["total"] > worst["total"]:
            worst = out
    return worst


# ============================================================================ bytes per GPU
def comm_bytes_per_gpu(model: ModelConfig, parallel: ParallelConfig, work: Workload,
                       precision: Precision = BF16_MIXED, stage: int = 0) -> dict[str, int]:
    """Wire bytes pipeline rank `stage` (default 0: rank 0, whose CommLog `--log-json`
    reports) sends per step on each axis: {"tp", "cp", "pp", "dp"}."""
    pc = parallel
    m = work.microbatches(pc)
    tokens = work.tokens_per_microbatch(pc)
    act, h = precision.act_bytes, model.dim
    layers = rank_layers(model, pc.pp, pc.virtual_stages, stage)
    first, last = stage == 0, stage == pc.pp - 1

    tp = layers * tp_layer_bytes(tokens, h, pc.tp, act, work.recompute)
    if pc.sp:
        tp += tp_norm_bytes(layers, last, h, pc.tp, precision.grad_bytes)
    if first:
        tp += tp_embedding_bytes(tokens, h, pc.tp, act, pc.sp)
    if last:
        tp += tp_head_bytes(tokens, h, pc.tp, act) + tp_cross_entropy_bytes(tokens, pc.tp)

    kv = cp_kv_bytes(tokens, model.n_kv_heads // pc.tp, model.head_dim, act)
    cp = layers * cp_layer_bytes(kv, pc.cp, pc.cp_impl, work.recompute)

    pp = pp_bytes(tokens, h, pc.pp, m, act, stage, pc.virtual_stages, pc.tp if pc.sp else 1)

    params = local_param_count(model, pc.tp, layers, first, last)
    dp = dp_bytes(params, pc.dp * pc.cp, pc.zero, m, precision.grad_bytes, precision.param_bytes)
    return {"tp": m * tp, "cp": m * cp, "pp": pp, "dp": dp}


# ============================================================================ time
def bubble_fraction(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a pipeline step, closed form (p ranks, m micro-batches, v chunks).

    afab, 1f1b: (p-1)/(m+p-1): p-1 slots of fill and drain, each a whole micro-batch.
    interleaved: (p-1)/(v m+p-1): the slot is one chunk, 1/v of the rank's layers.
    zb (ZB-H1): the weight-gradient passes W fill the drain; with forward, input-gradient
    and weight-gradient passes equally long a slot shrinks to a third: (p-1)/(3m+p-1).
    """
    p, m, v = pp, microbatches, virtual_stages
    if p == 1:
        return 0.0
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if schedule == "zb":
        return (p - 1) / (3 * m + p - 1)
    if schedule in ("afab", "1f1b"):
        return (p - 1) / (m + p - 1)
    raise ConfigError(f"--schedule {schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")


def group_bandwidth_GBps(cluster: Cluster, stride: int, size: int, world: int,
                         span: int | None = None) -> float:
    """Bandwidth per GPU (GB/s, before `Efficiency.network`) of one group's ring.

    Ranks are numbered in the [TP, CP, PP, DP] order and laid out on consecutive GPUs, so a
    group of `size` ranks `stride` apart covers `span` = stride * size GPUs. Inside one
    server: NVLink. Otherwise the NIC. If the group spans pods, each of its rings leaves a pod
    once; the pod's uplink (pod_size * NIC / oversubscription) is shared by the rings of all
    the world / size groups that run at once (those with a member in the pod).
    """
    span = stride * size if span is None else span
    if span <= cluster.gpus_per_node:
        return cluster.intra_node_GBps
    nic = cluster.inter_node_GBps
    if span <= cluster.pod_size:
        return nic
    rings = min(world // size, cluster.pod_size)
    uplink = cluster.pod_size * nic / cluster.pod_oversubscription
    return min(nic, uplink / rings)


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


def dp_group_span(pc: ParallelConfig) -> int:
    """GPUs between the first and the last member of a dp x cp group, plus its CP block: the
    CP ranks of a model copy are tp apart, the copies tp*cp*pp apart."""
    block = pc.tp * pc.cp
    return block * pc.pp * (pc.dp - 1) + block if pc.dp > 1 else block


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


def _estimate(model, pc: ParallelConfig, cluster, work: Workload, precision, eff) -> Estimate:
    gpus, peak, h, act = pc.world_size, cluster.peak_flops, model.dim, precision.act_bytes
    m = work.microbatches(pc)
    tokens = work.tokens_per_microbatch(pc)          # per GPU per micro-batch
    layers = model.n_layers / pc.pp                  # per GPU, balanced

    def seconds(nbytes, stride, size, span=None):
        if size <= 1 or nbytes == 0:
            return 0.0
        bw = group_bandwidth_GBps(cluster, stride, size, gpus, span) * eff.network
        return nbytes / (bw * 1e9)

    # -- one micro-batch on one GPU: compute, then the TP and CP traffic on its critical path
    t_compute, t_attention = compute_seconds(model, pc, work, peak, eff)
    tp_bytes = layers * tp_layer_bytes(tokens, h, pc.tp, act, work.recompute) + (
        tp_embedding_bytes(tokens, h, pc.tp, act, pc.sp) + tp_head_bytes(tokens, h, pc.tp, act)
        + tp_cross_entropy_bytes(tokens, pc.tp)) / pc.pp
    if pc.sp:
        tp_bytes += tp_norm_bytes(round(layers), False, h, pc.tp, precision.grad_bytes)
    t_tp = seconds(tp_bytes, 1, pc.tp)
    kv = cp_kv_bytes(tokens, model.n_kv_heads // pc.tp, model.head_dim, act)
    t_cp = seconds(layers * cp_layer_bytes(kv, pc.cp, pc.cp_impl, work.recompute), pc.tp, pc.cp)
    if pc.cp_impl == "ring":                         # K,V of the next block travel while this
        t_cp = max(0.0, t_cp - t_attention)          # block's attention is computed
    t_mb = t_compute + t_tp + t_cp

    # -- the pipeline: the bubble stretches the step; the fill and drain wait for transfers
    bubble = bubble_fraction(pc.schedule, pc.pp, m, pc.virtual_stages)
    t_pipeline = m * t_mb / (1 - bubble)
    t_p2p = seconds(tokens * h * act / (pc.tp if pc.sp else 1), pc.tp * pc.cp, pc.pp)
    t_pp = 0.0
    if pc.pp > 1:      # p-1 transfers each way; in between, sends hide behind the next chunk
        chunk = t_mb / pc.virtual_stages
        t_pp = 2 * (pc.pp - 1) * t_p2p + 2 * m * pc.virtual_stages * max(0.0, t_p2p - chunk)

    # -- data parallelism over dp x cp
    n = pc.dp * pc.cp
    params = param_total_local(model, pc.tp) / pc.pp
    t_rs = seconds(ring_bytes("reduce_scatter", n, int(params * precision.grad_bytes)), pc.tp, n,
                   dp_group_span(pc))
    t_ag = seconds(ring_bytes("all_gather", n, int(params * precision.param_bytes)), pc.tp, n,
                   dp_group_span(pc))
    t_dp = dp_exposed_seconds(pc.zero, pc.bucket_mb == 0 and pc.zero < 3, m, t_rs, t_ag, t_mb)

    step = t_pipeline + t_pp + t_dp
    model_flops = work.tokens * flops.flops_per_token(model, work.seq_len)
    hw_flops = work.tokens * flops.hardware_flops_per_token(model, work.seq_len, work.recompute)
    mfu = model_flops / (step * gpus * peak)
    mem = memory_per_gpu(model, pc, work, precision)
    gb = {k: v / 1e9 for k, v in mem.items()}
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


def param_total_local(model: ModelConfig, tp: int) -> float:
    """Parameters of the whole model as one TP rank holds them (all stages together)."""
    return local_param_count(model, tp, model.n_layers, True, True)


# ============================================================================ Llama 3's Table 4
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
        embedding"), ZeRO-1-like FSDP (fp32 gradients reduce-scattered once per step),
        sequence parallelism, all-gather context parallelism."""
        return ParallelConfig(tp=self.tp, cp=self.cp, pp=self.pp, dp=self.dp, zero=1, sp=True,
                              schedule="interleaved", virtual_stages=8, cp_impl="allgather")


TABLE4 = (
    Table4Row(8192, 8, 1, 16, 64, 8192, 430, 0.43),
    Table4Row(16384, 8, 1, 16, 128, 8192, 400, 0.41),
    Table4Row(16384, 8, 16, 16, 8, 131072, 380, 0.38),
)


def table4(efficiency: Efficiency = LLAMA3_EFFICIENCY) -> list[tuple[Table4Row, Estimate]]:
    """Our prediction for each row of Llama 3's Table 4: bf16, 16M tokens, micro-batch 1."""
    model = ModelConfig.preset("llama3-405b")
    return [(row, estimate(model, row.parallel(), LLAMA3_CLUSTER, row.seq_len,
                           global_batch_tokens=TABLE4_BATCH_TOKENS, microbatch_size=1,
                           recompute="none", efficiency=efficiency)) for row in TABLE4]


def table4_fit_counts(dense, attention, tolerance: float = 0.03,
                      network: float = LLAMA3_EFFICIENCY.network) -> list[list[int]]:
    """For each pair of constants (rows: `attention`, columns: `dense`), how many of the
    three Table 4 rows are predicted within `tolerance` of the published MFU."""
    out = []
    for a in attention:
        eff_row = []
        for d in dense:
            eff = Efficiency(dense=float(d), attention=float(a), network=network)
            eff_row.append(sum(abs(e.mfu - row.mfu) <= tolerance for row, e in table4(eff)))
        out.append(eff_row)
    return out


# ============================================================================ search
def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


def best_configs(model: ModelConfig, cluster: Cluster = LLAMA3_CLUSTER, gpus: int = 8192,
                 seq_len: int = 8192, global_batch_tokens: int = TABLE4_BATCH_TOKENS,
                 microbatch_sizes=(1, 2), schedules=("1f1b", "interleaved"),
                 recompute=RECOMPUTE, zero=(1,), cp_impl: str = "allgather",
                 tps=None, cps=None, pps=None, top: int | None = 10,
                 precision: Precision = BF16_MIXED,
                 efficiency: Efficiency = LLAMA3_EFFICIENCY) -> list[Estimate]:
    """Valid layouts of `gpus` GPUs ranked by predicted MFU, among those that fit in HBM.

    Searched: tp, cp, pp powers of two (tp up to one server; or the degrees `tps`, `cps`,
    `pps` given), dp the rest; each schedule (the interleaved one with every chunk count 2,
    4, ... that fits), micro-batch size, recompute policy and ZeRO stage given. Sequence
    parallelism on whenever tp > 1. `top=None` returns them all.
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
            chunks = [1]
            if sched == "interleaved":
                if pp == 1:
                    continue
                chunks = [v for v in _powers_of_two(model.n_layers + 2) if v > 1 and pp * v <= model.n_layers + 2]
            for v in chunks:
                pc = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, zero=z, sp=tp > 1,
                                    schedule=sched, virtual_stages=v, cp_impl=cp_impl)
                try:
                    e = estimate(model, pc, cluster, seq_len, global_batch_tokens=global_batch_tokens,
                                 microbatch_size=mbs, recompute=rc, precision=precision,
                                 efficiency=efficiency)
                except ConfigError:
                    continue
                if e.fits_memory:
                    found.append(e)
    found.sort(key=lambda e: -e.mfu)
    return found if top is None else found[:top]


# ============================================================================ the CLI
class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr and exit status 2, no usage block."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m minipar.costmodel",
                description="Predict MFU, step time, memory and comm bytes of a 4D-parallel "
                            "training step. Defaults: Llama 3 405B, Table 4 row 1.")
    g = p.add_argument_group("model (a preset, or any field of it overridden)")
    g.add_argument("--preset", default="llama3-405b",
                   help="a model preset (default llama3-405b); the hardware is the Llama 3 "
                        "cluster unless overridden below")
    for flag, dest in (("--layers", "n_layers"), ("--dim", "dim"), ("--ffn-dim", "ffn_dim"),
                       ("--heads", "n_heads"), ("--kv-heads", "n_kv_heads"), ("--vocab", "vocab_size")):
        g.add_argument(flag, dest=dest, type=int)
    g = p.add_argument_group("hardware (defaults: the Llama 3 cluster)")
    for flag, dest, typ in (("--peak-tflops", "peak_tflops", float), ("--hbm-gb", "hbm_gb", float),
                            ("--gpus-per-node", "gpus_per_node", int),
                            ("--intra-node-GBps", "intra_node_GBps", float),
                            ("--inter-node-Gbps", "inter_node_Gbps", float)):
        g.add_argument(flag, dest=dest, type=typ)
    g = p.add_argument_group("layout and batch")
    g.add_argument("--gpus", type=int, help="total GPUs; must equal tp*cp*pp*dp (default: that product)")
    g.add_argument("--tp", type=int, default=8)
    g.add_argument("--cp", type=int, default=1)
    g.add_argument("--pp", type=int, default=16)
    g.add_argument("--dp", type=int, help="default: --gpus / (tp*cp*pp), or 64 without --gpus")
    g.add_argument("--seq-len", type=int, default=8192)
    b = g.add_mutually_exclusive_group()
    b.add_argument("--global-batch-tokens", type=int, help="tokens per step (default 16M = 2048 x 8192)")
    b.add_argument("--global-batch", type=int, help="sequences per step")
    g.add_argument("--microbatch-size", type=int, default=1, help="sequences per micro-batch")
    g.add_argument("--schedule", choices=SCHEDULES, default="interleaved")
    g.add_argument("--virtual-stages", type=int, default=None,
                   help="chunks per pipeline rank (default with --schedule interleaved: 8, or "
                        "the most, a power of two, that pp x v <= layers + 2 allows; else 1)")
    g.add_argument("--zero", type=int, default=1)
    g.add_argument("--recompute", choices=RECOMPUTE, default="none")
    g.add_argument("--cp-impl", choices=("ring", "allgather"), default="allgather")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism (default: on when tp > 1)")
    g.add_argument("--bucket-mb", type=float, default=25.0)
    g = p.add_argument_group("numerics and the model's constants")
    g.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16",
                   help="bf16: Llama 3's mixed precision; fp32: minipar on CPU")
    e = LLAMA3_EFFICIENCY
    g.add_argument("--dense-efficiency", type=float, default=e.dense)
    g.add_argument("--attention-efficiency", type=float, default=e.attention)
    g.add_argument("--network-efficiency", type=float, default=e.network)
    p.add_argument("--json", action="store_true", help="print the estimate as one JSON object")
    return p


def config_from_args(args) -> tuple[ModelConfig, Cluster, ParallelConfig, Workload]:
    """Turn parsed flags into the four objects; ConfigError names the flag and the rule."""
    try:
        model = ModelConfig.preset(args.preset)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--model", "--preset")) from None
    overrides = {k: getattr(args, k) for k in ("n_layers", "dim", "ffn_dim", "n_heads",
                                               "n_kv_heads", "vocab_size") if getattr(args, k) is not None}
    if overrides:
        model = replace(model, name="custom", **overrides)
    cluster = LLAMA3_CLUSTER
    hw = {k: getattr(args, k) for k in ("peak_tflops", "hbm_gb", "gpus_per_node",
                                        "intra_node_GBps", "inter_node_Gbps") if getattr(args, k) is not None}
    if hw:
        cluster = replace(cluster, name="custom", **hw)
    dp = args.dp
    inner = args.tp * args.cp * args.pp
    if dp is None:
        if args.gpus is None:
            dp = 64
        elif inner > 0 and args.gpus % inner == 0:
            dp = args.gpus // inner
        else:
            raise ConfigError(f"--gpus {args.gpus} is not divisible by tp*cp*pp = "
                              f"{args.tp}*{args.cp}*{args.pp} = {inner}")
    if args.gpus is not None and args.gpus != inner * dp:
        raise ConfigError(f"--gpus {args.gpus} must equal tp*cp*pp*dp = "
                          f"{args.tp}*{args.cp}*{args.pp}*{dp} = {inner * dp}")
    v = args.virtual_stages
    if v is None:                 # Llama 3's 8 chunks per rank, or as many as the layers allow
        v = 1
        while args.schedule == "interleaved" and v < 8 and args.pp * v * 2 <= model.n_layers + 2:
            v *= 2
    sp = args.sp if args.sp is not None else args.tp > 1
    parallel = ParallelConfig(tp=args.tp, cp=args.cp, pp=args.pp, dp=dp, zero=args.zero,
                              bucket_mb=args.bucket_mb, sp=sp, schedule=args.schedule,
                              virtual_stages=v, cp_impl=args.cp_impl)
    work = make_workload(args.seq_len, args.global_batch_tokens, args.global_batch,
                         args.microbatch_size, args.recompute)
    return model, cluster, parallel, work


def human_bytes(n: float) -> str:
    """1234567 -> '1.23 MB' (decimal units, as link speeds are quoted)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def format_estimate(e: Estimate, model: ModelConfig, cluster: Cluster) -> str:
    pc, w = e.parallel, e.workload
    lines = [
        f"model    {model.name}: {model.n_layers} layers, dim {model.dim}, ffn {model.ffn_dim}, "
        f"{model.n_heads} heads ({model.n_kv_heads} KV), vocab {model.vocab_size}",
        f"cluster  {cluster.name}: {cluster.peak_tflops:g} TFLOP/s, {cluster.hbm_gb:g} GB, "
        f"{cluster.gpus_per_node}/node, NVLink {cluster.intra_node_GBps:g} GB/s, NIC {cluster.inter_node_Gbps:g} Gb/s",
        f"layout   {pc.world_size} GPUs = TP{pc.tp} CP{pc.cp} PP{pc.pp} DP{pc.dp}, {pc.schedule}"
        + (f" v={pc.virtual_stages}" if pc.virtual_stages > 1 else "")
        + f", ZeRO-{pc.zero}, SP {'on' if pc.sp else 'off'}, CP {pc.cp_impl}, recompute {w.recompute}",
        f"batch    {w.global_batch} x {w.seq_len} tokens = {w.tokens:,}; micro-batch {w.microbatch_size}, "
        f"{e.microbatches} per DP rank",
        "",
        f"MFU              {100 * e.mfu:6.1f} %   (PaLM convention: 6N + 12 L h s FLOPs per token)",
        f"HFU              {100 * e.hfu:6.1f} %",
        f"TFLOP/s per GPU  {e.tflops_per_gpu:8.4g}",
        f"step time        {e.step_time_s:8.4g} s   ({e.tokens_per_s:,.0f} tokens/s)",
        f"bubble           {100 * e.bubble_fraction:6.1f} %",
        "time per step    " + ", ".join(f"{k} {v:.3g} s" for k, v in e.time_breakdown_s.items()),
        f"memory per GPU   {human_bytes(e.memory_gb_per_gpu * 1e9)} "
        + ("(fits)" if e.fits_memory else f"(DOES NOT FIT in {cluster.hbm_gb:g} GB)") + ": "
        + ", ".join(f"{k} {human_bytes(v * 1e9)}" for k, v in e.memory_breakdown_gb.items()),
        "bytes per GPU    " + ", ".join(f"{k} {human_bytes(v)}" for k, v in e.comm_bytes_per_gpu.items())
        + "   (sent per step, ring algorithm, pipeline rank 0)",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        model, cluster, parallel, work = config_from_args(args)
        eff = Efficiency(args.dense_efficiency, args.attention_efficiency, args.network_efficiency)
        for flag, value in (("--dense-efficiency", eff.dense), ("--attention-efficiency", eff.attention),
                            ("--network-efficiency", eff.network)):
            if not 0 < value <= 1:
                raise ConfigError(f"{flag} {value} must be in (0, 1]")
        e = estimate(model, parallel, cluster, work.seq_len, global_batch=work.global_batch,
                     microbatch_size=work.microbatch_size, recompute=work.recompute,
                     precision=PRECISIONS[args.precision], efficiency=eff)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(e.as_dict()))
    else:
        print(format_estimate(e, model, cluster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
