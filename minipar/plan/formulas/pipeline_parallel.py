"""Pipeline parallelism's closed forms: the bubble and the bytes.

Chapter "Pipeline parallelism". Torch-free, like every file of `minipar.plan.formulas`. How
many micro-batches a schedule keeps in flight is a count of activations held:
`formulas.memory.in_flight_chunks`, with the rest of the memory model's formulas.
"""
from __future__ import annotations

from ..config import SCHEDULES, ConfigError, unknown
from .collectives import wire_bytes


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
