"""Every closed form of the book, written once: bytes on the wire, bubbles, stage splits, memory.

Chapters: all of them. Each axis chapter derives how many bytes its collectives put on the
wire, the pipeline chapter how long the bubble is and which layers each stage holds, the
data-parallel and "MFU and communication volume" chapters what a GPU stores. The axis files
(`minipar.parallel.*`), the cost model (`minipar.costmodel`), the figures and the tests all
call the functions here, so that the number a chapter derives, the number `CommLog`
measures and the number the cost model predicts cannot drift apart.

Pure arithmetic on integers and configs: the standard library and `minipar.config` only,
never torch, so the book and the cost model import it anywhere.

Bytes convention (as `minipar.comm` counts them): what one rank puts on the wire under the
ring algorithm, rounded down once per collective call: all-reduce 2(n-1)/n S, all-gather,
reduce-scatter, all-to-all and broadcast (n-1)/n S (S = the full tensor), send S on the
sender, recv nothing.
"""
from __future__ import annotations

import functools
import math

from .config import CP_IMPLS, SCHEDULES, ConfigError, ModelConfig


# ============================================================ collectives (chapter "Collectives")
def wire_bytes(op: str, n: int, size: int) -> int:
    """Bytes one rank sends for `op` over n ranks on a message of `size` bytes (ring)."""
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1) * size // n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * size // n
    if op == "send":
        return size
    if op == "recv":
        return 0
    if op == "broadcast":   # pipelined ring broadcast: every rank but the last forwards S
        return (n - 1) * size // n
    raise ValueError(f"unknown collective {op!r}")


def all_reduce_time(size: float, n: int, alpha: float, bandwidth: float) -> float:
    """The alpha-beta model of a ring all-reduce of `size` bytes over n ranks: 2(n-1) steps,
    each paying the latency alpha, and 2(n-1)/n * size bytes through one link."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bandwidth


ALL_REDUCE_ALGORITHMS = ("ring", "tree", "in-network", "root")


def all_reduce_cost(algorithm: str, n: int, size: float, alpha: float = 0.0,
                    bandwidth: float = float("inf")) -> tuple[float, float]:
    """(bytes the busiest rank sends, seconds) of an all-reduce of `size` bytes over n ranks.

    ring        2(n-1) steps; 2(n-1)/n S per rank: the least any rank-to-rank algorithm sends.
    tree        NCCL's double binary tree: each rank is inside one tree and a leaf of the
                other, so it sends about 2S, pipelined; only 2 log2(n) steps of latency.
    in-network  the switch sums (NVLS on NVSwitch, SHARP on InfiniBand): each rank sends its
                S once and receives the sum once; two steps of latency.
    root        everyone sends to rank 0, which sums and sends back: (n-1) S through its link.
    """
    if n <= 1:
        return 0.0, 0.0
    if algorithm == "ring":
        sent, steps = 2 * (n - 1) / n * size, 2 * (n - 1)
    elif algorithm == "tree":
        sent, steps = 2.0 * size, 2 * math.ceil(math.log2(n))
    elif algorithm == "in-network":
        sent, steps = float(size), 2
    elif algorithm == "root":
        sent, steps = (n - 1) * float(size), 2
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {ALL_REDUCE_ALGORITHMS}")
    return sent, steps * alpha + sent / bandwidth


# ============================================================ data parallelism and ZeRO
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
        return wire_bytes("all_reduce", n, g)
    if zero == 1:
        return wire_bytes("reduce_scatter", n, g) + wire_bytes("all_gather", n, p)
    if zero == 2:
        return m * wire_bytes("reduce_scatter", n, g) + wire_bytes("all_gather", n, p)
    if zero == 3:
        return m * (2 * wire_bytes("all_gather", n, p) + wire_bytes("reduce_scatter", n, g))
    raise ConfigError(f"--zero {zero} is unknown; choose 0, 1, 2 or 3")


def bucket_timeline(bucket_bytes, ready_s, n: int, alpha: float,
                    bandwidth: float) -> list[tuple[float, float]]:
    """(start, end) of each bucket's all-reduce when bucket i can be launched at ready_s[i]
    (the naive version: every bucket when the backward ends) and one link carries them one after
    another, each taking all_reduce_time. The step's gradients are summed at the last end."""
    spans, free = [], 0.0
    for size, ready in zip(bucket_bytes, ready_s):
        start = max(ready, free)
        free = start + all_reduce_time(size, n, alpha, bandwidth)
        spans.append((start, free))
    return spans


def zero_padded_numel(numels, n: int) -> int:
    """Elements ZeRO moves for tensors of `numels` elements: each padded to a multiple of n."""
    return sum(math.ceil(k / n) * n for k in numels)


def zero_shards(stage: int, n: int) -> dict[str, int]:
    """Over how many ranks ZeRO `stage` splits each part of the training state: stage 1 the
    optimizer state, stage 2 also the gradients, stage 3 also the parameters."""
    return {"params": n if stage >= 3 else 1, "grads": n if stage >= 2 else 1,
            "optimizer": n if stage >= 1 else 1}


def zero_bytes_per_param(stage: int, n: int, param: float = 2, grad: float = 2,
                         optimizer: float = 12) -> dict[str, float]:
    """Bytes per parameter one rank holds at ZeRO `stage` over n ranks (the ZeRO paper's
    2 + 2 + K, K = 12 for mixed-precision Adam: fp32 master weight, m and v)."""
    shards = zero_shards(stage, n)
    return {"params": param / shards["params"], "grads": grad / shards["grads"],
            "optimizer": optimizer / shards["optimizer"]}


# ============================================================ tensor parallelism
def _tp_sum_bytes(size: int, tp: int, sp: bool) -> int:
    """Summing a tensor of `size` bytes over the TP ranks: an all-reduce, or under sequence
    parallelism a reduce-scatter and an all-gather of the same tensor (the same bytes)."""
    if sp:
        return wire_bytes("reduce_scatter", tp, size) + wire_bytes("all_gather", tp, size)
    return wire_bytes("all_reduce", tp, size)


def tp_layer_bytes(tokens: int, dim: int, tp: int, act_bytes: int, recompute: str = "none",
                   sp: bool = False) -> int:
    """Tensor-parallel bytes of one transformer layer for one micro-batch of `tokens` tokens.

    Megatron's layout: column-parallel in (q, k, v; gate, up), row-parallel out (o; down).
    Forward: an all-reduce of the [tokens, dim] output after o and after down (g).
    Backward: an all-reduce of the input gradient before q, k, v and before gate, up (f).
    So 4 all-reduces of tokens * dim elements. Sequence parallelism replaces each all-reduce
    by an all-gather plus a reduce-scatter of the same tensor: the same bytes.
    Full recomputation runs the forward again: 2 more.
    """
    n_ops = 4 + (2 if recompute == "full" else 0)
    return n_ops * _tp_sum_bytes(tokens * dim * act_bytes, tp, sp)


def tp_embedding_bytes(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool = False) -> int:
    """The vocab-parallel embedding (first stage): each rank looks up the tokens in its slice
    of the vocabulary (zeros elsewhere), and the [tokens, dim] results are summed: one
    all-reduce forward (g), nothing backward. With sequence parallelism the sum is a
    reduce-scatter, whose backward all-gathers the gradient (every rank's slice of the table
    needs all tokens' gradients): the same bytes either way."""
    return _tp_sum_bytes(tokens * dim * act_bytes, tp, sp)


def tp_head_bytes(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool = False) -> int:
    """The column-parallel output head (last stage): its input is copied to every rank, so
    the backward all-reduces the input gradient (f). With sequence parallelism: all-gather
    forward + reduce-scatter backward, the same bytes."""
    return _tp_sum_bytes(tokens * dim * act_bytes, tp, sp)


def tp_norm_bytes(layers: int, last: bool, dim: int, tp: int, grad_bytes: int,
                  shards: int = 1) -> int:
    """Sequence parallelism only: each rank's RMSNorm sees only its slice of the tokens, so
    the gradient of a (replicated) norm weight is a partial sum: two norms per layer, plus
    the final one on the last stage. Summed over TP once per *step*, in one all-reduce,
    after the micro-batches and the data-parallel reduction (sums commute). Under ZeRO the
    rank holds one piece of each gradient, of ceil(dim / shards) elements (shards: the
    dp x cp group's size; rank 0's piece, the largest): only the piece is summed."""
    n_norms = 2 * layers + (1 if last else 0)
    return wire_bytes("all_reduce", tp, n_norms * math.ceil(dim / shards) * grad_bytes)


def collective_matmul_bytes(size: int, tp: int) -> int:
    """`--tp-overlap`: an all-gather (or reduce-scatter) of a `size`-byte tensor done as
    tp-1 ring steps, each sending one chunk of size/tp: the collective's own bytes."""
    return (tp - 1) * (size // tp) if tp > 1 else 0


def tp_cross_entropy_bytes(tokens: int, tp: int) -> int:
    """The vocab-parallel cross-entropy (last stage) never gathers the logits: three
    all-reduces of one float32 per token, the max logit (for a stable exp), the sum of
    exponentials and the target's logit (which lives on one rank only)."""
    return 3 * wire_bytes("all_reduce", tp, tokens * 4)


def tp_wire_bytes_breakdown(cfg: ModelConfig, b: int, s: int, t: int, sp: bool = False,
                            n_micro: int = 1, layers: int | None = None, first: bool = True,
                            last: bool = True, act_bytes: int = 4, param_bytes: int = 4,
                            recompute: str = "none", norm_shards: int = 1) -> dict:
    """Bytes one TP rank sends per step, by source, under the ring algorithm.

    b sequences per micro-batch, s tokens of each that this rank's TP group sees (seq_len /
    cp), t = TP degree, `layers` blocks held (default: all), first/last pipeline stage.
    With A = b s h act_bytes, one all-reduce of A sends 2 (t-1)/t A, one all-gather or
    reduce-scatter (t-1)/t A. Per micro-batch:

      layers     4 all-reduces per block (f, g for attention and for the MLP, forward and
                 backward): 8 (t-1)/t A each.  SP: 4 all-gathers + 4 reduce-scatters, the same.
      embedding  g forward: 2 (t-1)/t A.  SP: reduce-scatter forward, all-gather backward.
      head       f backward: 2 (t-1)/t A.  SP: all-gather forward, reduce-scatter backward.
      loss       3 all-reduces of b s float32 numbers: 6 (t-1)/t b s 4.
      norms      SP only, once per step (not per micro-batch): the partial gradients of
                 the norm weights (2 per block, the final norm) in one all-reduce,
                 2 (t-1)/t h param_bytes each (`norm_shards`: ZeRO's pieces).
    `--tp-overlap` sends the same bytes (`collective_matmul_bytes`), as p2p ring steps.
    """
    layers = cfg.n_layers if layers is None else layers
    tokens, h = b * s, cfg.dim
    per_micro = {
        "layers": layers * tp_layer_bytes(tokens, h, t, act_bytes, recompute, sp),
        "embedding": tp_embedding_bytes(tokens, h, t, act_bytes, sp) if first else 0,
        "head": tp_head_bytes(tokens, h, t, act_bytes, sp) if last else 0,
        "loss": tp_cross_entropy_bytes(tokens, t) if last else 0,
    }
    per_step = {k: n_micro * v for k, v in per_micro.items()}
    per_step["norms"] = tp_norm_bytes(layers, last, h, t, param_bytes, norm_shards) if sp else 0
    return per_step


def tp_wire_bytes_per_step(cfg: ModelConfig, b: int, s: int, t: int, sp: bool = False,
                           n_micro: int = 1, **kw) -> int:
    """Total of `tp_wire_bytes_breakdown`: what CommLog measures under "tp" in one step."""
    return sum(tp_wire_bytes_breakdown(cfg, b, s, t, sp, n_micro, **kw).values())


# ============================================================ context parallelism
def cp_hops(cp: int, impl: str, recompute: str = "none") -> int:
    """How many times one rank sends a K/V-block-sized message per layer and micro-batch.

    ring:      forward cp-1 K/V blocks; backward cp-1 K/V blocks again (not stored: that
               would be the whole sequence's K,V) and cp-1 dK/dV accumulators (started one
               rank downstream of their block's owner, so cp-1 hops bring them home).
    allgather: (Llama 3) all-gather of cp blocks, (cp-1)/cp of them = cp-1 blocks, kept for
               the backward; its backward, a reduce-scatter of the same size, cp-1 more.
    Full recomputation repeats the forward part. The load-balanced causal layout sends whole
    blocks even where the mask will discard half of one.
    """
    if impl not in CP_IMPLS:
        raise ConfigError(f"--cp-impl {impl!r} is unknown; choose one of {', '.join(CP_IMPLS)}")
    if impl == "ulysses":
        raise ValueError("Ulysses moves q and the output too, not K/V blocks: ulysses_layer_bytes")
    if cp == 1:
        return 0
    forward, backward = cp - 1, (2 if impl == "ring" else 1) * (cp - 1)
    return forward * (2 if recompute == "full" else 1) + backward


def cp_kv_bytes(tokens: int, kv_heads: int, head_dim: int, act_bytes: int) -> int:
    """One rank's K and V for one layer: 2 tokens x kv_heads x head_dim, GQA not expanded
    (kv_heads is the rank's share: n_kv_heads / tp)."""
    return 2 * tokens * kv_heads * head_dim * act_bytes


def ulysses_kv_heads(kv_heads: int, cp: int) -> int:
    """KV heads a rank sends under Ulysses: its own, or, fewer than cp (GQA), each
    replicated to the cp/kv_heads ranks whose query heads read it: cp of them."""
    return kv_heads if kv_heads % cp == 0 else cp


def ulysses_layer_bytes(kv: int, cp: int, q_per_kv: int, recompute: str = "none") -> int:
    """DeepSpeed-Ulysses' bytes for one layer and micro-batch; `kv` = `cp_kv_bytes` of a
    rank with `ulysses_kv_heads`, q_per_kv = query heads per (sent) KV head.

    Forward: three all-to-alls, q (q_per_kv * kv/2 bytes), K and V together (kv), the
    output (as q): each sends (cp-1)/cp of its tensor. Backward: the same three, reversed.
    So 2 (cp-1)/cp (q_per_kv + 1) kv: per rank it *falls* as cp grows (each rank's tokens
    shrink), where the ring's and the all-gather's (cp-1) kv grow with cp.
    """
    if cp == 1:
        return 0
    per_pass = wire_bytes("all_to_all", cp, q_per_kv * kv // 2) * 2 + wire_bytes("all_to_all", cp, kv)
    return per_pass * (3 if recompute == "full" else 2)


def cp_layer_bytes(kv: int, cp: int, impl: str = "ring", recompute: str = "none",
                   q_per_kv: int = 1) -> int:
    """Context-parallel bytes of one layer and micro-batch; `kv` = `cp_kv_bytes` of a rank
    (q_per_kv: query heads per KV head, needed by Ulysses alone)."""
    if impl == "ulysses":
        return ulysses_layer_bytes(kv, cp, q_per_kv, recompute)
    return cp_hops(cp, impl, recompute) * kv


def cp_wire_bytes_per_step(model_cfg: ModelConfig, b: int, s: int, cp: int, impl: str = "ring",
                           n_micro: int = 1, tp: int = 1, n_layers: int | None = None,
                           dtype_bytes: int = 4, recompute: str = "none") -> int:
    """Bytes one CP rank sends per optimizer step: the formula `comm.LOG` is tested against.

    b: sequences per micro-batch on this rank, s: the full sequence length, n_layers: the
    layers this rank holds (all of them without pipeline parallelism). The K/V block of a
    rank is 2 (K and V) * b * s/cp * (n_kv_heads / tp) * head_dim elements: KV heads, not
    query heads, because GQA's K/V are sent un-expanded (Ulysses replicates them up to cp).
    """
    layers = model_cfg.n_layers if n_layers is None else n_layers
    kv_heads, q_heads = model_cfg.n_kv_heads // tp, model_cfg.n_heads // tp
    if impl == "ulysses":
        kv_heads = ulysses_kv_heads(kv_heads, cp)
    kv = cp_kv_bytes(b * (s // cp), kv_heads, model_cfg.head_dim, dtype_bytes)
    return n_micro * layers * cp_layer_bytes(kv, cp, impl, recompute, q_heads // kv_heads)


# ============================================================ pipeline parallelism
def split_layers(n_layers: int, n_stages: int, first_last_lighter: int = 0) -> list[range]:
    """Contiguous, balanced layer ranges, one per global stage (p*v of them with chunks).

    Sizes differ by at most one, the larger ones first. With `first_last_lighter=k` the
    first and the last stage get k layers fewer than a balanced split of n_layers + 2k
    (whose larger parts then go to middle stages): Llama 3's trick, since the embedding and
    the output head + loss live there and cost about a layer each. Llama 3 405B took one
    layer off each end; 126 layers on PP 16 with V 8 (126 + 2 = 128 = 16 x 8) leaves the
    first and last stage no transformer layer at all (only embedding, only head), as the
    paper describes its first and last model chunks.
    """
    k = first_last_lighter
    if n_stages < 1:
        raise ConfigError(f"--pp x --virtual-stages = {n_stages} stages must be positive")
    if k < 0:
        raise ConfigError(f"first_last_lighter={k} must be >= 0")
    if n_stages <= 2:
        k = 0                       # every stage is the first or the last: nothing to shift
    q, extra = divmod(n_layers + 2 * k, n_stages)
    sizes = [q] * n_stages
    order = list(range(1, n_stages - 1)) + [0, n_stages - 1] if k else range(n_stages)
    for i in list(order)[:extra]:
        sizes[i] += 1
    sizes[0] -= k
    sizes[-1] -= k
    if k == 0 and n_layers < n_stages:
        raise ConfigError(f"n_layers={n_layers} is fewer than the {n_stages} pipeline stages "
                          f"(--pp x --virtual-stages): every stage needs at least one layer")
    if min(sizes[1:-1], default=1) < 1 or min(sizes) < 0:
        raise ConfigError(f"n_layers={n_layers} on {n_stages} stages (--pp x --virtual-stages) "
                          f"with first_last_lighter={k}: every middle stage needs a layer and "
                          f"the first and last stage cannot drop below zero")
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def stage_split(n_layers: int, n_stages: int) -> list[range]:
    """The cost model's split: `split_layers`, balanced while every stage can hold a layer;
    with one or two stages more than layers, Llama 3's (`first_last_lighter=1`): the first
    stage holds only the embedding, the last only the head and loss (405B: 126 layers on
    16 x 8 = 128 stages, one layer each in between)."""
    return split_layers(n_layers, n_stages, 1 if n_stages > n_layers else 0)


def stage_layer_counts(n_layers: int, n_stages: int) -> list[int]:
    """Transformer layers of each global pipeline stage (pp * virtual_stages of them)."""
    return list(_stage_layer_counts(n_layers, n_stages))


@functools.lru_cache(maxsize=4096)
def _stage_layer_counts(n_layers: int, n_stages: int) -> tuple[int, ...]:
    # remembered: the planner asks for the same split tens of thousands of times
    return tuple(len(r) for r in stage_split(n_layers, n_stages))


def rank_layers(model: ModelConfig, pp: int, virtual_stages: int, stage: int) -> int:
    """Layers held by pipeline rank `stage` (its chunks are global stages c*pp + stage)."""
    counts = stage_layer_counts(model.n_layers, pp * virtual_stages)
    return sum(counts[c * pp + stage] for c in range(virtual_stages))


def bubble_fraction(schedule: str, pp: int, m: int, v: int = 1, t_f: float = 1.0,
                    t_b: float = 1.0, t_w: float = 1.0) -> float:
    """The closed-form bubble fraction (idle / (makespan x ranks)) of a schedule.

    p = pp ranks, m micro-batches, v chunks per rank. Each rank does m v T of work, T = t_f +
    t_b + t_w per micro-batch and chunk, and waits p-1 "slots" in all: while the first
    micro-batch fills the pipeline and the last drains it.
      afab, 1f1b:  a slot is a whole T: (p-1)/(m+p-1), for any times.
      interleaved: the slot is one chunk, 1/v of the rank's layers: (p-1)/(v m+p-1).
      zb (ZB-H1):  the weight-gradient passes W fill the drain, leaving slots of
                   t_f + t_b - t_w; with the three passes equally long (the default) a slot
                   shrinks to a third: (p-1)/(3m+p-1).
    Exact (checked by `simulate` in the tests) for afab and 1f1b always; for interleaved when
    m is a multiple of p (and of the consecutive N >= p); for zb when m >= p and
    t_w <= min(t_f, t_b).
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"--schedule {schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    p = pp
    if p == 1:
        return 0.0
    if schedule == "zb":
        slot, t = t_f + t_b - t_w, t_f + t_b + t_w
        return (p - 1) * slot / (m * t + (p - 1) * slot)
    v = v if schedule == "interleaved" else 1
    return (p - 1) / (v * m + p - 1)


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
    return microbatches * (forward_sends + backward_sends) * wire_bytes("send", pp, size)


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
    if schedule == "zb":      # W waits: every rank holds up to p (ZB-H1's memory bound)
        return min(m, p)
    return min(m, p - stage)


def in_flight_chunks(schedule: str, pp: int, microbatches: int, stage: int = 0,
                     virtual_stages: int = 1) -> list[int]:
    """Micro-batches in flight on each of pipeline rank `stage`'s chunks at its peak (the
    first chunk of rank 0 holds the embedding, the last chunk of the last rank the head:
    how many of *those* are in flight decides what they add). Interleaved: the warm-up's
    forwards go chunk by chunk in groups of p micro-batches (Megatron's order), so forward k
    belongs to chunk (k // p) mod v."""
    m, p, v = microbatches, pp, virtual_stages
    if schedule != "interleaved" or v == 1 or p == 1:
        return [int(in_flight_microbatches(schedule, p, m, stage))] * v
    total = min(p * (v - 1) + 2 * (p - 1 - stage) + 1, m * v)
    group = min(m, p)
    return [sum(1 for k in range(total) if (k // group) % v == c) for c in range(v)]


# ============================================================ what a GPU holds
def layer_param_count(model: ModelConfig) -> int:
    """Weights of one transformer block: attention, SwiGLU MLP and the two RMSNorm gains."""
    h, hd = model.dim, model.head_dim
    attention = h * model.n_heads * hd * 2 + h * model.n_kv_heads * hd * 2   # q, o; k, v
    mlp = 3 * h * model.ffn_dim                                              # gate, up, down
    return attention + mlp + 2 * h


def param_count(model: ModelConfig, embeddings: bool = True) -> int:
    """Parameters of the model, exactly as `minipar.model.Transformer` holds them.

    embeddings=False leaves out the input embedding table (a lookup, no FLOPs) and keeps the
    output head (a matmul): that is the N of 6N. With tied embeddings the shared table is the
    head, so it stays.
    """
    table = model.vocab_size * model.dim
    head = 0 if model.tie_embeddings else table
    total = model.n_layers * layer_param_count(model) + model.dim + head  # + final norm
    if embeddings or model.tie_embeddings:
        total += table
    return total


def local_param_count(model: ModelConfig, tp: int, layers: int, first: bool, last: bool) -> int:
    """Parameters one GPU holds: `layers` blocks sharded over tp (norm gains replicated), plus
    the vocab-parallel embedding on the first stage, the final norm and head on the last."""
    h = model.dim
    block = (layer_param_count(model) - 2 * h) // tp + 2 * h
    table = model.vocab_size * h // tp
    n = layers * block
    if first:
        n += table
    if last:
        n += h + (0 if model.tie_embeddings and first else table)
    return n


# What minipar's eager PyTorch code saves for the backward, tensor by tensor (chapter
# "Memory: where every byte goes" derives each line from model.py; tests/test_memory.py checks
# them against `memory.ActivationMeter`). Elements per token this rank holds (b x s/cp).
def norm_saved_elements(h: int, tp: int, sp: bool) -> float:
    """RMSNorm, then the linear that reads it: its input x, rsqrt (1 per token), x * rsqrt,
    and the gained output the linear saves: 3h + 1. Under SP the norm runs on 1/tp of the
    tokens and the linear saves the all-gathered output: (2h + 1)/tp + h."""
    return (2 * h + 1) / tp + h if sp else 3 * h + 1


def attention_saved_elements(model: ModelConfig, tp: int, cp: int = 1, cp_impl: str = "ring",
                             recompute: str = "none") -> float:
    """q, k, v after RoPE; the attention output (which o_proj saves too: one storage); its
    log-sum-exp (1 per head), over tp. All-gather context parallelism keeps the K/V of the
    whole sequence (cp times the local ones). Selective recompute keeps only q, k, v and the
    output o_proj saves: 2h + 2kv; the log-sum-exp (and all-gather's K/V) are recomputed."""
    h, kv, hq = model.dim, model.n_kv_heads * model.head_dim, model.n_heads
    if recompute == "selective":
        return (2 * h + 2 * kv) / tp
    kv_kept = 2 * kv * (cp if cp > 1 and cp_impl == "allgather" else 1)
    return (2 * h + kv_kept + hq) / tp


def layer_saved_breakdown(model: ModelConfig, tp: int = 1, sp: bool = False, cp: int = 1,
                          cp_impl: str = "ring", recompute: str = "none") -> dict[str, float]:
    """One transformer block, per token, by part: the two norms, attention, and SwiGLU's
    gate, silu(gate), up and their product (4 ffn/tp). Full recompute keeps only the
    block's input."""
    if recompute == "full":
        return {"input": model.dim / tp if sp else model.dim}
    return {"norms": 2 * norm_saved_elements(model.dim, tp, sp),
            "attention": attention_saved_elements(model, tp, cp, cp_impl, recompute),
            "mlp": 4 * model.ffn_dim / tp}


def layer_saved_elements(model: ModelConfig, tp: int = 1, sp: bool = False, cp: int = 1,
                         cp_impl: str = "ring", recompute: str = "none") -> float:
    """One transformer block's saved elements per token (`layer_saved_breakdown`, summed)."""
    return sum(layer_saved_breakdown(model, tp, sp, cp, cp_impl, recompute).values())


def weight_pass_kept_elements(model: ModelConfig, tp: int = 1, sp: bool = False, cp: int = 1,
                              cp_impl: str = "ring") -> float:
    """Full recompute under zero-bubble: what W's rerun of a block keeps until the chunk's
    W ends: all the block saves but its input (already kept) and what the weight gradients
    consume (each norm's x * rsqrt and output, the down projection's input)."""
    h, sp_t = model.dim, (tp if sp else 1)
    norm_read = norm_saved_elements(h, tp, sp) - (h + 1) / sp_t
    return (layer_saved_elements(model, tp, sp, cp, cp_impl) - h / sp_t
            - 2 * norm_read - model.ffn_dim / tp)


def rope_saved_elements(model: ModelConfig, seq_local: int) -> int:
    """cos and sin, [s, head_dim] each: per micro-batch and model chunk, not per token."""
    return 2 * seq_local * model.head_dim


def embedding_saved_bytes(tokens: int, tp: int) -> int:
    """The token ids (int64); the vocab-parallel embedding adds a 1-byte mask per token."""
    return tokens * (8 + (1 if tp > 1 else 0))


def head_saved_bytes(model: ModelConfig, tokens: int, tp: int, sp: bool, act_bytes: int = 4) -> float:
    """Final norm and head input, the softmax of the logits (vocab/tp per token), the targets
    (int64; + a 1-byte mask under TP; a 0-dim loss without)."""
    acts = (norm_saved_elements(model.dim, tp, sp) + model.vocab_size / tp) * act_bytes
    return tokens * (acts + 8 + (1 if tp > 1 else 0)) + (0 if tp > 1 else act_bytes)


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
