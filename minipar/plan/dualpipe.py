"""DualPipeV as schedule data: DeepSeek-V3's pipeline, simulated, never run by the trainer.

Chapter "Pipeline parallelism" (its section on DualPipe). DualPipe (DeepSeek-V3 technical
report, arXiv 2412.19437, section 3.2.1) feeds micro-batches from both ends of the pipeline
and pairs each forward chunk with another micro-batch's backward chunk, so that one's
all-to-alls hide behind the other's compute. DualPipeV is its "cut-in-half" form (Sea AI
Lab; deepseek-ai/DualPipe's `DualPipeV`): p ranks hold 2p stages in a V, rank r stage r on
the way down (chunk 0) and stage 2p-1-r on the way back (chunk 1), so the loss and the
embedding sit on rank 0 and the turn at the bottom needs no send. Its bubble
(the report's Table 2, with PP = 2p stages) is (p-1)(F&B + B - 3W), its activations 2p + 1
chunks on rank 0.

The actions are `schedules.Action`s whose chunk 1 is placed on the V's way back
(`VAction.stage`); `schedules.simulate` times them like any schedule, and
`schedule_analysis.peak_in_flight` counts what they hold. The trainer's schedules
(`config.SCHEDULES`) stay as they are: `SIMULATED` names the ones only simulated.
"""
from __future__ import annotations

from collections import deque

from .config import ConfigError
from .schedule_analysis import peak_in_flight
from .schedules import Action, Schedule, make_schedule, simulate

# Schedules the book simulates besides the trainer's (`config.SCHEDULES`)
SIMULATED = ("dualpipev",)


class VAction(Action):
    """An action of a V-shaped schedule: chunk 0 of rank r is stage r, chunk 1 stage 2p-1-r."""

    __slots__ = ()

    def stage(self, rank: int, pp: int) -> int:
        return rank if self.chunk == 0 else 2 * pp - 1 - rank


def dualpipev(pp: int, microbatches: int) -> Schedule:
    """Each of `pp` ranks' actions for `microbatches` micro-batches (at least 2 pp), in the
    eight phases of DeepSeek's DualPipeV (`_rank`)."""
    if pp < 1 or microbatches < 2 * pp:
        raise ConfigError(f"DualPipeV needs --pp >= 1 and --microbatches >= 2 x pp = {2 * pp}; "
                          f"got pp {pp}, microbatches {microbatches}")
    return [_rank(r, pp, microbatches) for r in range(pp)]


def _rank(r: int, p: int, m: int) -> list[VAction]:
    """Rank r's order. Forwards and backwards of each chunk take its micro-batches in turn; a
    backward "zb" computes the input gradient only and owes its weight gradient W, paid
    later in order; any other backward is followed by its W at once (a full backward)."""
    acts, f, b, owed = [], [0, 0], [0, 0], deque()

    def fwd(c):
        acts.append(VAction("F", f[c], c))
        f[c] += 1

    def bwd(c, zb=False):
        acts.append(VAction("B", b[c], c))
        (owed.append if zb else acts.append)(VAction("W", b[c], c))
        b[c] += 1

    for _ in range(2 * (p - r - 1)):      # 1: the way down fills
        fwd(0)
    for _ in range(r + 1):                # 2: both chunks forward
        fwd(0), fwd(1)
    for _ in range(p - r - 1):            # 3: the first backwards, their W's owed
        bwd(1, True), acts.append(owed.popleft()), fwd(1)
    for _ in range(m - 2 * p + r + 1):    # 4: the steady state, forward and backward paired
        fwd(0), bwd(1), fwd(1), bwd(0)
    for _ in range(p - r - 1):            # 5: the way down has no forwards left
        bwd(1), fwd(1), bwd(0)
    half = (r + 1) // 2
    for i in range(r + 1):                # 6: backwards only; the later half owe their W
        bwd(1, i >= half + (r % 2 == 0))
        bwd(0, i >= half)
    for _ in range(p - r - 1):            # 7: a W paid, a backward owed
        acts.append(owed.popleft()), bwd(0, True)
    acts += owed                          # 8: the W's left
    return acts


def simulated_schedule(name: str, pp: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """A schedule of the trainer's (`schedules.make_schedule`) or of `SIMULATED`, by name."""
    if name == "dualpipev":
        return dualpipev(pp, microbatches)
    return make_schedule(name, pp, microbatches, virtual_stages)


def comparison(p: int = 4, m: int = 8, t_f: float = 1.0, t_b: float = 1.0,
                        t_w: float = 1.0) -> dict[str, tuple[float, float]]:
    """{schedule: (bubble fraction, peak activations in rank-layers)} on p ranks of the same
    model: 1F1B and ZB-H1 run one stage per rank (passes of 2 t), DualPipeV two chunks of
    half of it (passes of t); activations count chunks in flight times the chunk's share
    of the rank's layers (1 for a stage, 1/2 for a DualPipeV chunk)."""
    out = {}
    for name, sched, scale, share in (("1F1B", make_schedule("1f1b", p, m), 2, 1.0),
                                      ("ZB-H1", make_schedule("zb", p, m), 2, 1.0),
                                      ("DualPipeV", dualpipev(p, m), 1, 0.5)):
        tl = simulate(sched, scale * t_f, scale * t_b, scale * t_w)
        out[name] = (tl.bubble_fraction, max(peak_in_flight(sched, "W")) * share)
    return out
