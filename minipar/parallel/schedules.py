"""Pipeline schedules as data: who runs which forward and backward, in which order.

Chapter "Pipeline parallelism", its pure half. A schedule is one list of `Action`s per
pipeline rank. Nothing here starts a process: the same lists are drawn as Gantt charts,
timed by `simulate`, checked by the tests, turned into each rank's program of sends,
receives and computations (`p2p_plan`, proved deadlock-free by `check_p2p_plan`), and
executed on real ranks by `minipar.parallel.pipeline`.

Vocabulary (the field's, as in Megatron-LM and the zero-bubble paper):

* p = `n_stages`, the number of pipeline ranks; m = `n_microbatches`, micro-batches per step.
* v = `n_virtual`, model chunks per rank (virtual stages). Chunk c on rank r holds the global
  stage c*p + r, so the model's p*v stages go round the ranks v times.
* An action is F (forward), B (backward) or, when the backward is split as in zero-bubble
  schedules, B = gradient w.r.t. the stage's input and W = gradient w.r.t. its weights.
  Only B sits on the critical path between stages; W can wait to fill a bubble.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from ..config import ConfigError, positive, schedule_problems

# The chapter's closed forms (the bubble of each schedule, the stage split) are in
# `minipar.formulas.pipeline_parallel`, with the other chapters' formulas.


class ScheduleError(ValueError):
    """A schedule cannot run: an action is missing or repeated, or the order deadlocks."""


class Action(NamedTuple):
    """One unit of pipeline work: `kind` ("F", "B" or "W") of `microbatch` on model `chunk`.

    A named tuple: immutable, hashable, cheap (schedules hold thousands of them).
    """

    kind: str
    microbatch: int
    chunk: int = 0

    def stage(self, rank: int, n_stages: int) -> int:
        """The global model stage this action runs on rank `rank` of `n_stages` ranks."""
        return stage_of(rank, self.chunk, n_stages)

    def __repr__(self) -> str:  # compact, so a printed schedule reads like the figures
        return f"{self.kind}{self.microbatch}" + (f"c{self.chunk}" if self.chunk else "")


Schedule = list[list[Action]]


def stage_of(rank: int, chunk: int, n_stages: int) -> int:
    """Global stage of `chunk` on `rank`: chunks go round the ranks (Megatron's layout)."""
    return chunk * n_stages + rank


def rank_and_chunk(stage: int, n_stages: int) -> tuple[int, int]:
    """The (rank, chunk) that holds global `stage`: the inverse of `stage_of`."""
    return stage % n_stages, stage // n_stages


# --------------------------------------------------------------------------- schedules

def make_schedule(name: str, n_stages: int, n_microbatches: int, n_virtual: int = 1,
                  consecutive: int | None = None) -> Schedule:
    """Each pipeline rank's list of actions for one training step.

    name: "afab" (GPipe: all forwards, then all backwards), "1f1b" (PipeDream-flush),
    "interleaved" (Megatron's interleaved 1F1B over `n_virtual` chunks per rank) or
    "zb" (ZB-H1 of the zero-bubble paper: backward split into B and W, W deferred).

    consecutive (interleaved only): N, how many micro-batches pass through one chunk before
    the rank moves on to its next chunk. Megatron's depth-first schedule has N = p (the
    default); N = m is the breadth-first schedule; Llama 3 made N tunable, so that m need
    not be a multiple of p (p = 4, m = 10: N = 5) and m may even be below p (N = m).
    Rules: m a multiple of N, and N >= p unless N = m. With N >= p the bubble is exactly
    (p-1)/(v*m+p-1); a larger N holds more activations (see `peak_in_flight`).

    Errors (`ConfigError`, a ValueError) name the CLI flag and the rule broken.
    """
    p, m, v = n_stages, n_microbatches, n_virtual
    # The layout's rules (`config.schedule_problems`), but with a group size of its own,
    # `consecutive`, "m a multiple of p" (rule "groups") gives way to the rules below.
    bad = positive(pp=p, microbatches=m, virtual_stages=v) or [
        b for b in schedule_problems(name, p, m, v) if consecutive is None or b.rule != "groups"]
    if bad:
        raise ConfigError(*bad)
    if name != "interleaved":
        if consecutive is not None:
            raise ConfigError(f"consecutive micro-batches only apply to --schedule interleaved, "
                              f"not {name!r}")
        return {"afab": _afab, "1f1b": _one_f_one_b, "zb": _zb_h1}[name](p, m)
    n = p if consecutive is None else consecutive
    if n < 1:
        raise ConfigError(f"consecutive={n} micro-batches per chunk must be a positive integer")
    if m % n:
        raise ConfigError(f"--schedule interleaved with {n} consecutive micro-batches needs "
                          f"--microbatches ({m}) to be a multiple of {n}")
    if n < p and n != m:
        # Found with `simulate`: several groups smaller than the pipeline deadlock in this
        # order. A single group of m < p runs (Llama 3's "fewer micro-batches than stages").
        raise ConfigError(f"--schedule interleaved with {n} consecutive micro-batches needs "
                          f"at least --pp {p} of them per group, or all --microbatches "
                          f"({m}) in one group")
    return _interleaved(p, m, v, n)


def _afab(p: int, m: int) -> Schedule:
    # Every rank: all m forwards, then all m backwards. Each rank holds all m micro-batches'
    # activations at the turn.
    return [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]
            for _ in range(p)]


def _warmup_1f1b(rank: int, p: int, m: int) -> int:
    # A rank runs ahead by as many forwards as there are ranks after it: rank p-1 turns its
    # first micro-batch round at once, rank 0 has p-1 forwards in flight before its first B.
    return min(p - 1 - rank, m)


def _one_f_one_b(p: int, m: int) -> Schedule:
    out = []
    for r in range(p):
        w = _warmup_1f1b(r, p, m)
        acts = [Action("F", i) for i in range(w)]
        for i in range(m - w):                       # steady state: one forward, one backward
            acts += [Action("F", w + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - w, m)]   # cool-down: drain the backwards
        out.append(acts)
    return out


def _interleaved(p: int, m: int, v: int, n: int) -> Schedule:
    """Megatron's interleaved 1F1B, generalised to N consecutive micro-batches per chunk.

    The k-th forward of a rank is micro-batch `mb` of chunk `c`: micro-batches go in groups of
    N; a group passes through chunk 0, then chunk 1, ... (backwards: chunk v-1 first).
    """
    if v == 1:
        return _one_f_one_b(p, m)  # one chunk per rank: interleaving is plain 1F1B

    def forward(k: int) -> Action:
        group, pos = divmod(k, n * v)
        return Action("F", group * n + pos % n, pos // n)

    def backward(k: int) -> Action:
        group, pos = divmod(k, n * v)
        return Action("B", group * n + pos % n, v - 1 - pos // n)

    total = m * v
    out = []
    for r in range(p):
        # Before its first backward (micro-batch 0 on the last chunk) a rank must have run the
        # forwards of the other chunks for the first group (N*(v-1)), plus Megatron's
        # 2*(p-1-r): the forwards that fit while micro-batch 0 goes down the remaining ranks
        # and back. With free communication p-1-r would give the same bubble with less
        # memory; the extra forwards keep the rank busy while p2p transfers are in flight
        # (simulate with t_comm > 0 to see it).
        w = min(n * (v - 1) + 2 * (p - 1 - r), total)
        acts = [forward(k) for k in range(w)]
        for k in range(total - w):
            acts += [forward(w + k), backward(k)]
        acts += [backward(k) for k in range(total - w, total)]
        out.append(acts)
    return out


def _zb_h1(p: int, m: int) -> Schedule:
    # ZB-H1 (Qi et al., 2024): the F/B order of 1F1B, with each backward split into B (input
    # gradient, sent upstream at once) and W (weight gradient, local). Rank r postpones its
    # first W by r steady-state cycles, so that every rank, not just rank 0, keeps p
    # micro-batches between F and W; the postponed W's then fill the cool-down bubble.
    out = []
    for r in range(p):
        w = _warmup_1f1b(r, p, m)
        acts = [Action("F", i) for i in range(w)]
        pending = []                                  # W's owed, oldest first
        for i in range(m - w):
            acts += [Action("F", w + i), Action("B", i)]
            pending.append(Action("W", i))
            if i >= r:                                # after the delay: one W per cycle
                acts.append(pending.pop(0))
        for i in range(m - w, m):                     # cool-down: each B then an owed W
            acts.append(Action("B", i))
            pending.append(Action("W", i))
            acts.append(pending.pop(0))
        acts += pending
        out.append(acts)
    return out


# --------------------------------------------------------------------------- validity

def _n_chunks(schedule: Schedule) -> int:
    return 1 + max((a.chunk for acts in schedule for a in acts), default=0)


def dependencies(action: Action, rank: int, n_stages: int, n_chunks: int = 1
                 ) -> list[tuple[str, int, int]]:
    """What `action` on `rank` waits for, as (kind, microbatch, global stage) triples.

    F of stage k needs F of stage k-1 (its input activation); B of stage k needs its own F
    (the saved activations) and B of stage k+1 (the gradient of its output); W needs its own
    B (which produced the gradient of the stage's output it multiplies with its input).
    """
    s = action.stage(rank, n_stages)
    mb = action.microbatch
    last = n_stages * n_chunks - 1
    if action.kind == "F":
        return [("F", mb, s - 1)] if s > 0 else []
    if action.kind == "B":
        return [("F", mb, s)] + ([("B", mb, s + 1)] if s < last else [])
    if action.kind == "W":
        return [("B", mb, s)]
    raise ScheduleError(f"unknown action kind {action.kind!r} (expected F, B or W)")


def check_schedule(schedule: Schedule) -> None:
    """Raise `ScheduleError` unless every action that must run runs exactly once.

    Every rank needs F and B of every micro-batch on every chunk, and W too if the schedule
    splits backwards (any W at all), each once, and on each rank F before B before W. Whether
    the cross-rank order can run is `simulate`'s question (it detects deadlocks).
    """
    p, v = len(schedule), _n_chunks(schedule)
    mbs = sorted({a.microbatch for acts in schedule for a in acts})
    kinds = ("F", "B", "W") if any(a.kind == "W" for acts in schedule for a in acts) else ("F", "B")
    want = Counter(Action(k, i, c) for k in kinds for i in mbs for c in range(v))
    for r, acts in enumerate(schedule):
        got = Counter(acts)
        if got != want:
            wrong = {"repeated": sorted(a for a, n in got.items() if n > 1),
                     "missing": sorted(set(want - got)),
                     "unexpected": sorted(set(got - want) - set(want))}
            raise ScheduleError(f"rank {r} of {p}: " + "; ".join(
                f"{what} {acts}" for what, acts in wrong.items() if acts))
        seen = set()
        for a in acts:
            local = {"B": "F", "W": "B"}.get(a.kind)
            if local and Action(local, a.microbatch, a.chunk) not in seen:
                raise ScheduleError(f"rank {r}: {a!r} comes before {local}{a.microbatch} "
                                    f"on chunk {a.chunk}")
            seen.add(a)


def peak_in_flight(schedule: Schedule, release: str = "B") -> list[int]:
    """Per rank, the most (micro-batch, chunk) pairs whose activations are held at once.

    A pair is in flight from its F until its `release` action: "B" (the default; the input
    gradient is computed, most activations are freed) or "W" (the weight gradient still needs
    the stage's input and output gradient, so zero-bubble schedules hold a little until W).
    With one chunk per rank this is the activation memory in units of one micro-batch's
    activations of one stage: m for afab, at most p for 1f1b.
    """
    if release not in ("B", "W"):
        raise ValueError(f"release={release!r}: choose 'B' or 'W'")
    if not any(a.kind == "W" for acts in schedule for a in acts):
        release = "B"                     # an unsplit B computes both gradients at once
    out = []
    for acts in schedule:
        live = peak = 0
        for a in acts:
            if a.kind == "F":
                live += 1
                peak = max(peak, live)
            elif a.kind == release:
                live -= 1
        out.append(peak)
    return out


# --------------------------------------------------------------------------- simulation

class Event(NamedTuple):
    """An action placed in time on its rank."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float

    def as_dict(self) -> dict:
        return self._asdict()


@dataclass(frozen=True)
class Timeline:
    """Events of one step; the bubble is idle time over the area makespan x ranks."""

    events: list[Event]
    n_ranks: int
    makespan: float

    @property
    def busy(self) -> float:
        return sum(e.end - e.start for e in self.events)

    @property
    def bubble_fraction(self) -> float:
        area = self.makespan * self.n_ranks
        return (area - self.busy) / area if area > 0 else 0.0


def simulate(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_w: float = 0.0,
             t_comm: float = 0.0) -> Timeline:
    """Run `schedule` in simulated time and return its `Timeline`.

    Times are per micro-batch per chunk. Each rank executes its list in order; an action
    starts when its rank is free and its `dependencies` have finished (plus `t_comm` when a
    dependency ran on another rank). If the schedule splits backwards (it has W actions),
    B takes t_b and W takes t_w; otherwise B computes both gradients and takes t_b + t_w,
    so one set of times compares 1F1B and zero-bubble fairly. Raises `ScheduleError` if the
    order deadlocks: every rank's next action waits for something that never comes.
    """
    check_schedule(schedule)
    p, v = len(schedule), _n_chunks(schedule)
    split = any(a.kind == "W" for acts in schedule for a in acts)
    duration = {"F": t_f, "B": t_b if split else t_b + t_w, "W": t_w}
    # Each action with what it waits for: (kind, microbatch, stage) keys, and the extra
    # delay of each (the p2p transfer, when the dependency ran on another rank).
    plan = [[(a, a.stage(r, p), [(d, t_comm if d[2] % p != r else 0.0)
                                 for d in dependencies(a, r, p, v)])
             for a in acts] for r, acts in enumerate(schedule)]
    done: dict[tuple[str, int, int], float] = {}      # (kind, mb, stage) -> end time
    free = [0.0] * p                                   # when each rank is next idle
    nxt = [0] * p                                      # index of each rank's next action
    events: list[Event] = []
    progress = True
    while progress:                                    # sweep the ranks until none can move
        progress = False
        for r in range(p):
            while nxt[r] < len(plan[r]):               # run rank r as far as it can go
                a, stage, deps = plan[r][nxt[r]]
                if not all(d in done for d, _ in deps):
                    break
                start = max([free[r]] + [done[d] + delay for d, delay in deps])
                free[r] = done[(a.kind, a.microbatch, stage)] = start + duration[a.kind]
                events.append(Event(r, a.kind, a.microbatch, a.chunk, start, free[r]))
                nxt[r] += 1
                progress = True
    if any(nxt[r] < len(acts) for r, acts in enumerate(schedule)):
        raise ScheduleError("schedule deadlocks: " + _blocked(schedule, nxt, done, p, v))
    events.sort(key=lambda e: e.rank)                  # stable: each rank's list order
    return Timeline(events, p, max(free, default=0.0))


def _blocked(schedule, nxt, done, p, v) -> str:
    waits = []
    for r, acts in enumerate(schedule):
        if nxt[r] < len(acts):
            a = acts[nxt[r]]
            need = [f"{k}{mb} of stage {s} (rank {rank_and_chunk(s, p)[0]})"
                    for k, mb, s in dependencies(a, r, p, v) if (k, mb, s) not in done]
            waits.append(f"rank {r} is stuck at {a!r}, waiting for {', '.join(need)}")
    return "; ".join(waits)


def timeline_from_events(events) -> Timeline:
    """A `Timeline` from measured events (dicts with rank, kind, microbatch, chunk, start,
    end in seconds, as the executor's --trace writes them); time 0 is the earliest start."""
    evs = [e if isinstance(e, Event) else
           Event(int(e["rank"]), str(e["kind"]), int(e["microbatch"]), int(e.get("chunk", 0)),
                 float(e["start"]), float(e["end"])) for e in events]
    if not evs:
        return Timeline([], 0, 0.0)
    t0 = min(e.start for e in evs)
    evs = sorted((Event(e.rank, e.kind, e.microbatch, e.chunk, e.start - t0, e.end - t0)
                  for e in evs), key=lambda e: (e.rank, e.start, e.end))
    return Timeline(evs, 1 + max(e.rank for e in evs), max(e.end for e in evs))


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


def inputs_of(a: Action, rank: int, p: int, n_stages: int) -> list[Message]:
    """Messages action `a` on `rank` must receive before it can run."""
    s = a.stage(rank, p)
    if a.kind == "F" and s > 0:
        return [Message("act", a.microbatch, s - 1)]
    if a.kind == "B" and s < n_stages - 1:
        return [Message("grad", a.microbatch, s + 1)]
    return []


def outputs_of(a: Action, rank: int, p: int, n_stages: int) -> list[Message]:
    """Messages action `a` on `rank` sends when it is done."""
    s = a.stage(rank, p)
    if a.kind == "F" and s < n_stages - 1:
        return [Message("act", a.microbatch, s)]
    if a.kind == "B" and s > 0:
        return [Message("grad", a.microbatch, s)]
    return []


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
    n_stages = p * (1 + max(a.chunk for acts in schedule for a in acts))
    when = {(e.rank, e.kind, e.microbatch, e.chunk): (e.start, e.end)
            for e in simulate(schedule, 1.0, 1.0, 1.0).events}

    def produced(msg: Message) -> float:
        rank, chunk = msg.src_stage % p, msg.src_stage // p
        return when[(rank, "F" if msg.kind == "act" else "B", msg.microbatch, chunk)][1]

    plan = []
    for r, acts in enumerate(schedule):
        keyed = []
        for i, a in enumerate(acts):
            start, end = when[(r, a.kind, a.microbatch, a.chunk)]
            keyed += [((produced(msg), 0, msg), ("recv", msg)) for msg in inputs_of(a, r, p, n_stages)]
            keyed.append(((start, 1, (i,)), ("compute", a)))
            keyed += [((end, 0, msg), ("send", msg)) for msg in outputs_of(a, r, p, n_stages)]
        plan.append([step for _, step in sorted(keyed, key=lambda kv: kv[0])])
    return plan


def check_p2p_plan(plan) -> None:
    """Run `plan` as if every send and receive blocked until its partner is posted (the
    strictest transport, a rendezvous) and raise `RuntimeError` if it cannot finish.
    It also proves each pair of ranks posts its messages to each other in the same order."""
    p = len(plan)
    n_stages = 1 + max(max(m.src_stage, m.dst_stage) for prog in plan
                       for kind, m in prog if kind != "compute")
    where = lambda s: s % p                          # noqa: E731 - the rank of a global stage
    pos = [0] * p
    while True:
        moved = False
        for r in range(p):
            while pos[r] < len(plan[r]) and plan[r][pos[r]][0] == "compute":
                pos[r] += 1
                moved = True
            if pos[r] == len(plan[r]):
                continue
            kind, msg = plan[r][pos[r]]
            peer = where(msg.dst_stage if kind == "send" else msg.src_stage)
            partner = ("recv" if kind == "send" else "send", msg)
            if pos[peer] < len(plan[peer]) and plan[peer][pos[peer]] == partner:
                pos[r] += 1
                pos[peer] += 1
                moved = True
        if all(pos[r] == len(plan[r]) for r in range(p)):
            return
        if not moved:
            stuck = [f"rank {r} at {plan[r][pos[r]]}" for r in range(p) if pos[r] < len(plan[r])]
            raise RuntimeError(f"p2p plan deadlocks over {n_stages} stages: " + "; ".join(stuck))
