"""Pipeline schedules as data: who runs which forward and backward, in which order.

Chapter "Pipeline parallelism", its pure half. A schedule is one list of `Action`s per
pipeline rank. Nothing here starts a process: the same lists are drawn as Gantt charts,
timed by `simulate`, checked by the tests, turned into each rank's program of sends,
receives and computations (`p2p_plan`), and executed on real ranks by
`minipar.trainer.parallel.pipeline`. The questions only the book and the tests ask of a schedule
(the activations it holds, whether its plan can deadlock, a measured timeline) are
answered in `schedule_analysis.py`, which the trainer never imports.

Vocabulary (the field's, as in Megatron-LM and the zero-bubble paper):

* p = `pp`, the number of pipeline ranks; m = `n_microbatches`, micro-batches per step.
* v = `n_virtual`, model chunks per rank (virtual stages). Chunk c on rank r holds the global
  stage c*p + r, so the model's `n_stages` = p*v stages go round the ranks v times.
* An action is F (forward), B (backward) or, when the backward is split as in zero-bubble
  schedules, B = gradient w.r.t. the stage's input and W = gradient w.r.t. its weights.
  Only B sits on the critical path between stages; W can wait to fill a bubble.
"""

import functools
import itertools
from collections import Counter
from typing import NamedTuple

from .blocking import run_until_blocked, stuck
from .config import ConfigError, ModelConfig, positive, refuse, schedule_problems
from .flops import moe_layer_count

# The chapter's closed forms (the bubble of each schedule, the bytes, what is in flight) are
# in `minipar.plan.formulas.pipeline_parallel`, with the other chapters' formulas.


class ScheduleError(ValueError):
    """A schedule cannot run: an action is missing or repeated, or the order deadlocks."""

class Action(NamedTuple):
    """One unit of pipeline work: `kind` ("F", "B" or "W") of `microbatch` on model `chunk`.

    A named tuple: immutable, hashable, cheap (schedules hold thousands of them).
    """

    kind: str
    microbatch: int
    chunk: int = 0

    def stage(self, rank: int, pp: int) -> int:
        """The global model stage this action runs on rank `rank` of `pp` ranks."""
        return stage_of(rank, self.chunk, pp)

    def __repr__(self) -> str:  # compact, so a printed schedule reads like the figures
        return f"{self.kind}{self.microbatch}" + (f"c{self.chunk}" if self.chunk else "")


Schedule = list[list[Action]]


def stage_of(rank: int, chunk: int, pp: int) -> int:
    """Global stage of `chunk` on `rank` of `pp`: chunks go round the ranks (Megatron's layout)."""
    return chunk * pp + rank


def rank_and_chunk(stage: int, pp: int) -> tuple[int, int]:
    """The (rank, chunk) that holds global `stage`: the inverse of `stage_of`."""
    return stage % pp, stage // pp


# --------------------------------------------------------------------------- the stage split
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
    # (n_stages >= 1 is the layout's rule "positive"; below it, divmod fails loudly. The
    # callers pass first_last_lighter 0 or 1.)
    k = first_last_lighter if n_stages > 2 else 0   # <= 2 stages: each is an end, no shift
    if k == 0 and n_layers < n_stages:
        raise ConfigError(f"n_layers={n_layers} is fewer than the {n_stages} pipeline stages "
                          f"(--pp x --virtual-stages): every stage needs at least one layer")
    q, extra = divmod(n_layers + 2 * k, n_stages)
    sizes = [q] * n_stages
    order = [*range(1, n_stages - 1), 0, n_stages - 1] if k else list(range(n_stages))
    for i in order[:extra]:
        sizes[i] += 1
    sizes[0] -= k
    sizes[-1] -= k
    if min(sizes[1:-1], default=1) < 1 or min(sizes) < 0:
        raise ConfigError(f"n_layers={n_layers} on {n_stages} stages (--pp x --virtual-stages) "
                          f"with first_last_lighter={k}: every middle stage needs a layer and "
                          f"the first and last stage cannot drop below zero")
    bounds = list(itertools.accumulate(sizes, initial=0))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


@functools.lru_cache(maxsize=4096)   # the planner asks for one split tens of thousands of times
def stage_split(n_layers: int, n_stages: int) -> tuple[range, ...]:
    """The cost model's split: `split_layers`, balanced while every stage can hold a layer;
    with one or two stages more than layers, Llama 3's (`first_last_lighter=1`): the first
    stage holds only the embedding, the last only the head and loss (405B: 126 layers on
    16 x 8 = 128 stages, one layer each in between). A tuple: remembered, so never changed."""
    return tuple(split_layers(n_layers, n_stages, 1 if n_stages > n_layers else 0))


def stage_layer_counts(n_layers: int, n_stages: int) -> list[int]:
    """Transformer layers of each global pipeline stage (pp * virtual_stages of them)."""
    return [len(r) for r in stage_split(n_layers, n_stages)]


def stage_moe_counts(model: ModelConfig, n_stages: int) -> list[int]:
    """Mixture-of-experts blocks of each global stage (`flops.moe_layer_count`)."""
    if not model.is_moe:           # the planner asks millions of times for dense models
        return [0] * n_stages
    return [moe_layer_count(model, r) for r in stage_split(model.n_layers, n_stages)]


def rank_layers(model: ModelConfig, pp: int, virtual_stages: int, rank: int,
                moe: bool = False) -> int:
    """Layers held by pipeline rank `rank` (its chunks are global stages c*pp + rank); with
    `moe`, only its mixture-of-experts blocks."""
    n = pp * virtual_stages
    counts = stage_moe_counts(model, n) if moe else stage_layer_counts(model.n_layers, n)
    return sum(counts[stage_of(rank, c, pp)] for c in range(virtual_stages))


# --------------------------------------------------------------------------- schedules

def make_schedule(name: str, pp: int, n_microbatches: int, n_virtual: int = 1,
                  consecutive: int | None = None) -> Schedule:
    """Each pipeline rank's list of actions for one training step.

    name: "afab" (GPipe: all forwards, then all backwards), "1f1b" (PipeDream-flush),
    "interleaved" (Megatron's interleaved 1F1B over `n_virtual` chunks per rank) or
    "zb" (ZB-H1 of the zero-bubble paper: backward split into B and W, W deferred).

    consecutive (interleaved only, `--consecutive-microbatches`): N, how many micro-batches
    pass through one chunk before the rank moves on to its next chunk. Megatron's
    depth-first schedule has N = p (the default); N = m is the breadth-first schedule; Llama 3
    made N tunable, so that m need not be a multiple of p (p = 4, m = 10: N = 5) and m may
    even be below p (N = m). Rules: m a multiple of N, and N >= p unless N = m. With N >= p
    the bubble is exactly (p-1)/(v*m+p-1); a larger N holds more activations
    (`schedule_analysis.peak_in_flight`).

    Errors (`ConfigError`, a ValueError) name the CLI flag and the rule broken
    (`config.schedule_problems`, the rules the layout's check applies too).
    """
    p, m, v = pp, n_microbatches, n_virtual
    refuse(positive(pp=p, microbatches=m, virtual_stages=v)
           or schedule_problems(name, p, m, v, consecutive))
    if name != "interleaved":
        return {"afab": _afab, "1f1b": _one_f_one_b, "zb": _zb_h1}[name](p, m)
    return _interleaved(p, m, v, p if consecutive is None else consecutive)


def _afab(p: int, m: int) -> Schedule:
    # Every rank: all m forwards, then all m backwards. Each rank holds all m micro-batches'
    # activations at the turn.
    return [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]
            for _ in range(p)]


def _warmup_1f1b(rank: int, p: int, m: int) -> int:
    # A rank runs ahead by as many forwards as there are ranks after it: rank p-1 turns its
    # first micro-batch round at once, rank 0 has p-1 forwards in flight before its first B.
    return min(p - 1 - rank, m)


def _phases(warmup: int, total: int, nth=Action) -> list[Action]:
    """One rank's 1F1B order of `total` forwards and backwards: `warmup` forwards, then one
    forward and one backward at a time, then the backwards left. `nth("F", k)` is the rank's
    k-th forward, `nth("B", k)` its k-th backward (plain 1F1B: micro-batch k, one chunk)."""
    acts = [nth("F", k) for k in range(warmup)]
    for k in range(total - warmup):                  # steady state: one forward, one backward
        acts += [nth("F", warmup + k), nth("B", k)]
    return acts + [nth("B", k) for k in range(total - warmup, total)]  # cool-down: drain


def _one_f_one_b(p: int, m: int) -> Schedule:
    return [_phases(_warmup_1f1b(r, p, m), m) for r in range(p)]


def _interleaved(p: int, m: int, v: int, n: int) -> Schedule:
    """Megatron's interleaved 1F1B, generalised to N consecutive micro-batches per chunk.

    The k-th forward of a rank is micro-batch `mb` of chunk `c`: micro-batches go in groups of
    N; a group passes through chunk 0, then chunk 1, ... (backwards: chunk v-1 first).
    """
    if v == 1:
        return _one_f_one_b(p, m)  # one chunk per rank: interleaving is plain 1F1B

    def nth(kind: str, k: int) -> Action:
        group, pos = divmod(k, n * v)
        return Action(kind, group * n + pos % n, pos // n if kind == "F" else v - 1 - pos // n)

    # Before its first backward (micro-batch 0 on the last chunk) a rank must have run the
    # forwards of the other chunks for the first group (N*(v-1)), plus Megatron's 2*(p-1-r):
    # the forwards that fit while micro-batch 0 goes down the remaining ranks and back. With
    # free communication p-1-r would give the same bubble with less memory; the extra
    # forwards keep the rank busy while p2p transfers are in flight (simulate with t_comm > 0
    # to see it).
    return [_phases(min(n * (v - 1) + 2 * (p - 1 - r), m * v), m * v, nth) for r in range(p)]


def _zb_h1(p: int, m: int) -> Schedule:
    # ZB-H1 (Qi et al., 2024): the F/B order of 1F1B, with each backward split into B (input
    # gradient, sent upstream at once) and W (weight gradient, local). Rank r postpones its
    # first W by r steady-state cycles, so that every rank, not just rank 0, keeps p
    # micro-batches between F and W; the postponed W's then fill the cool-down bubble.
    out = []
    for r, one_f_one_b in enumerate(_one_f_one_b(p, m)):
        # after the delay (or from the cool-down on, if that comes first): a W after each B
        first_paid = min(r, m - _warmup_1f1b(r, p, m))
        acts, owed = [], []                           # W's owed, oldest first
        for a in one_f_one_b:
            acts.append(a)
            if a.kind == "B":
                owed.append(Action("W", a.microbatch))
                if a.microbatch >= first_paid:
                    acts.append(owed.pop(0))
        out.append(acts + owed)
    return out


# --------------------------------------------------------------------------- validity

def _n_chunks(schedule: Schedule) -> int:
    return 1 + max((a.chunk for acts in schedule for a in acts), default=0)


def dependencies(action: Action, rank: int, pp: int, n_chunks: int = 1
                 ) -> list[tuple[str, int, int]]:
    """What `action` on `rank` of `pp` waits for, as (kind, microbatch, global stage) triples.

    F of stage k needs F of stage k-1 (its input activation); B of stage k needs its own F
    (the saved activations) and B of stage k+1 (the gradient of its output); W needs its own
    B (which produced the gradient of the stage's output it multiplies with its input).
    """
    s, mb = action.stage(rank, pp), action.microbatch
    if action.kind == "F":
        return [("F", mb, s - 1)] if s > 0 else []
    if action.kind == "B":      # the last stage starts from its loss
        return [("F", mb, s)] + ([("B", mb, s + 1)] if s < pp * n_chunks - 1 else [])
    return [("B", mb, s)]             # W (`check_schedule` has refused any other kind)


def check_schedule(schedule: Schedule) -> None:
    """Raise `ScheduleError` unless every action that must run runs exactly once.

    Every rank needs F and B of every micro-batch on every chunk, and W too if the schedule
    splits backwards (any W at all), each once, and on each rank F before B before W. Whether
    the cross-rank order can run is `simulate`'s question (it detects deadlocks).
    """
    p, v = len(schedule), _n_chunks(schedule)
    mbs = sorted({a.microbatch for acts in schedule for a in acts})
    kinds = ("F", "B", "W") if any(a.kind == "W" for acts in schedule for a in acts) else ("F", "B")
    want = {Action(k, i, c) for k in kinds for i in mbs for c in range(v)}
    for r, acts in enumerate(schedule):
        got = Counter(acts)
        wrong = {"repeated": sorted(a for a, n in got.items() if n > 1),
                 "missing": sorted(want - got.keys()), "unexpected": sorted(got.keys() - want)}
        if any(wrong.values()):
            raise ScheduleError(f"rank {r} of {p}: " + "; ".join(
                f"{what} {acts}" for what, acts in wrong.items() if acts))
        at = {a: i for i, a in enumerate(acts)}          # each action once, by now
        for a in acts:
            local = {"B": "F", "W": "B"}.get(a.kind)     # what must come first on this rank
            if local and at[Action(local, a.microbatch, a.chunk)] > at[a]:
                raise ScheduleError(f"rank {r}: {a!r} comes before {local}{a.microbatch} "
                                    f"on chunk {a.chunk}")


# --------------------------------------------------------------------------- simulation

class Event(NamedTuple):
    """An action placed in time on its rank."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


class Timeline(NamedTuple):
    """Events of one step; the bubble is idle time over the area makespan x ranks."""

    events: list[Event]
    n_ranks: int
    makespan: float

    @property
    def bubble_fraction(self) -> float:
        area = self.makespan * self.n_ranks
        busy = sum(e.end - e.start for e in self.events)
        return (area - busy) / area if area > 0 else 0.0


def simulate(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_w: float = 0.0,
             t_comm: float = 0.0) -> Timeline:
    """Run `schedule` in simulated time and return its `Timeline`.

    Times are per micro-batch per chunk. Each rank executes its list in order
    (`blocking.run_until_blocked`); an action starts when its rank is free and its
    `dependencies` have finished (plus `t_comm` when a dependency ran on another rank). If
    the schedule splits backwards (it has W actions), B takes t_b and W takes t_w; otherwise
    B computes both gradients and takes t_b + t_w, so one set of times compares 1F1B and
    zero-bubble fairly. Raises `ScheduleError` if the order deadlocks: every rank's next
    action waits for something that never comes.
    """
    check_schedule(schedule)
    pp, v = len(schedule), _n_chunks(schedule)
    split = any(a.kind == "W" for acts in schedule for a in acts)
    duration = {"F": t_f, "B": t_b if split else t_b + t_w, "W": t_w}
    # Each action with what it waits for: (kind, microbatch, stage) keys, and the extra
    # delay of each (the p2p transfer, when the dependency ran on another rank).
    held = [{a.stage(r, pp) for a in acts} for r, acts in enumerate(schedule)]   # each rank's stages
    plan = {r: [(a, [(d, 0.0 if d[2] in held[r] else t_comm) for d in dependencies(a, r, pp, v)])
                for a in acts] for r, acts in enumerate(schedule)}
    done = {}                                          # end times by (kind, mb, stage)

    def start(r: int, step, free: float):
        a, deps = step
        if not all(d in done for d, _ in deps):
            return None
        begin = max([free] + [done[d] + delay for d, delay in deps])
        done[(a.kind, a.microbatch, a.stage(r, pp))] = begin + duration[a.kind]
        return begin, begin + duration[a.kind]

    spans = run_until_blocked(plan, start)
    if blocked := stuck(plan, spans):
        raise ScheduleError("schedule deadlocks: " + _blocked(blocked, done, pp))
    events = [Event(r, a.kind, a.microbatch, a.chunk, *span)
              for r, acts in enumerate(schedule) for a, span in zip(acts, spans[r])]
    return Timeline(events, pp, max((s[-1][1] if s else 0.0 for s in spans.values()), default=0.0))


def _blocked(blocked: dict, done: dict, pp: int) -> str:
    """Why `simulate` stopped: each stuck rank's next action and what it still waits for."""
    return "; ".join(f"rank {r} is stuck at {a!r}, waiting for " + ", ".join(
        f"{k}{mb} of stage {s} (rank {rank_and_chunk(s, pp)[0]})"
        for (k, mb, s), _ in deps if (k, mb, s) not in done) for r, (a, deps) in blocked.items())


# --------------------------------------------------------------------------- the p2p plan
class Message(NamedTuple):
    """What one stage sends another: the activation of `microbatch` leaving `src_stage`
    forwards ("act"), or the gradient w.r.t. its input going backwards ("grad")."""

    kind: str
    microbatch: int
    src_stage: int

    @property
    def dst_stage(self) -> int:
        return self.src_stage + 1 if self.kind == "act" else self.src_stage - 1

    def tag(self, n_microbatches: int) -> int:
        return 2 * (self.src_stage * n_microbatches + self.microbatch) + (self.kind == "grad")


# What each kind of action passes on, and which way: F its output activation to the next
# stage, B the gradient w.r.t. its input to the previous one; W nothing.
_PASSES = {"F": ("act", 1), "B": ("grad", -1)}


def inputs_of(a: Action, rank: int, pp: int, n_stages: int) -> list[Message]:
    """Messages action `a` on `rank` of `pp` must receive before it can run (of `n_stages`
    global stages): what the same kind of action passed on from the neighbouring stage (F
    from the one before, B the one after)."""
    kind, step = _PASSES.get(a.kind, (None, 0))
    src = a.stage(rank, pp) - step
    return [Message(kind, a.microbatch, src)] if step and 0 <= src < n_stages else []


def outputs_of(a: Action, rank: int, pp: int, n_stages: int) -> list[Message]:
    """Messages action `a` on `rank` of `pp` sends when it is done."""
    kind, step = _PASSES.get(a.kind, (None, 0))
    msg = Message(kind, a.microbatch, a.stage(rank, pp))
    return [msg] if step and 0 <= msg.dst_stage < n_stages else []


def p2p_plan(schedule) -> list[list[tuple[str, object]]]:
    """Each rank's program for one step: ("recv", Message), ("compute", Action) and
    ("send", Message) steps, every rank's in one global order.

    The order is the simulated timeline's (t_f = t_b = t_w = 1; only the order matters,
    not the times): a message is keyed by the time its producer finishes, on both ends, a
    computation by its start, and at equal times messages come first. A receive is thus
    posted after the previous computation and before the one that needs it; a send right
    after the computation that produced it.
    """
    p = len(schedule)
    n_stages = p * _n_chunks(schedule)
    when = {(e.kind, e.microbatch, stage_of(e.rank, e.chunk, p)): (e.start, e.end)
            for e in simulate(schedule, 1.0, 1.0, 1.0).events}

    def at(msg: Message) -> tuple:                   # when the action that produces it ends
        return when[("F" if msg.kind == "act" else "B", msg.microbatch, msg.src_stage)][1], 0, msg

    plan = []
    for r, acts in enumerate(schedule):
        keyed = []
        for i, a in enumerate(acts):
            keyed += [(at(msg), ("recv", msg)) for msg in inputs_of(a, r, p, n_stages)]
            keyed.append(((when[a.kind, a.microbatch, a.stage(r, p)][0], 1, (i,)), ("compute", a)))
            keyed += [(at(msg), ("send", msg)) for msg in outputs_of(a, r, p, n_stages)]
        plan.append([step for _, step in sorted(keyed, key=lambda kv: kv[0])])
    return plan
