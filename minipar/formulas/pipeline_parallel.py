"""Pipeline parallelism's closed forms: the stage split, the bubble, the bytes, what is in flight.

Chapter "Pipeline parallelism". Torch-free, like every file of `minipar.formulas`.
"""
from __future__ import annotations

import functools

from ..config import SCHEDULES, ConfigError, ModelConfig, unknown
from .collectives import wire_bytes


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
        raise ConfigError(unknown("--schedule", schedule, SCHEDULES))
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
