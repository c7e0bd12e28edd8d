"""A pipeline schedule examined rather than run: the activations it holds, whether its
messages can deadlock, and the timeline a real run of it measured.

Chapter "Pipeline parallelism". The trainer needs none of this (`python -m minipar.train`
does not import this file): the book, the notebook and the tests ask these questions of the
schedules `schedules.make_schedule` builds and of the programs `schedules.p2p_plan` derives.

    peak_in_flight        the most micro-batches whose activations a rank holds at once
    check_p2p_plan        a program replayed with blocking sends: it finishes, or deadlocks
    pipeline_events       a `--profile` trace's F/B/W actions of one pipeline replica
    timeline_from_events  those actions as a `Timeline`, drawn and timed like a simulated one
"""
from __future__ import annotations

import itertools

from .blocking import run_until_blocked, stuck
from .schedules import Event, Schedule, Timeline, rank_and_chunk


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
    held = {"F": 1, release: -1}          # the running count: +1 at each F, -1 at each release
    return [max(itertools.accumulate((held.get(a.kind, 0) for a in acts), initial=0))
            for acts in schedule]


def check_p2p_plan(plan) -> None:
    """Run `plan` (`schedules.p2p_plan`) as if every send and receive blocked until its
    partner is posted (the strictest transport, a rendezvous) and raise `RuntimeError` if it
    cannot finish. It also proves each pair of ranks posts its messages to each other in
    the same order. Each rank runs until it blocks (`blocking.run_until_blocked`): a send
    offers its message and waits until the receiver, at that very receive, has taken it."""
    pp = len(plan)
    # each rank's posts: computations never block
    posts = {r: [step for step in prog if step[0] != "compute"] for r, prog in enumerate(plan)}
    n_stages = 1 + max(max(m.src_stage, m.dst_stage) for steps in posts.values() for _, m in steps)
    offered, taken = set(), set()

    def start(r: int, step, clock: float):
        what, msg = step
        if what == "send":                   # the sender waits at its send until taken
            offered.add(msg)
            return (clock, clock) if msg in taken else None
        if msg not in offered or rank_and_chunk(msg.dst_stage, pp)[0] != r:
            return None
        taken.add(msg)
        return clock, clock

    blocked = stuck(posts, run_until_blocked(posts, start))
    if blocked:
        raise RuntimeError(f"p2p plan deadlocks over {n_stages} stages: " + "; ".join(
            f"rank {r} at {step}" for r, step in blocked.items()))


# -- a measured run ---------------------------------------------------------------------------
def pipeline_events(trace: dict, replica: dict | None = None) -> list[dict]:
    """The F/B/W spans of one pipeline replica (the ranks at tp = cp = dp = 0 unless
    `replica` says otherwise) of a `--profile` trace (`traces.load`), as
    `timeline_from_events` takes them: rank (the pipeline rank), kind, microbatch, chunk,
    start, end in seconds, and step, in_flight and activation_bytes where recorded. An
    action's step is the `step` span around it (a span's args reach every event inside it)."""
    coords = {int(r): c for r, c in trace["otherData"]["minipar"]["ranks"].items()}
    want = {"tp": 0, "cp": 0, "dp": 0, **(replica or {})}
    mine = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"
            and e["args"].get("kind") in ("F", "B", "W")
            and all(coords[e["pid"]].get(a, 0) == v for a, v in want.items())]
    return [{"chunk": 0, "step": 0, **e["args"], "rank": coords[e["pid"]].get("pp", 0),
             "global_rank": e["pid"], "start": e["ts"] / 1e6, "end": (e["ts"] + e["dur"]) / 1e6}
            for e in mine]


def timeline_from_events(events) -> Timeline:
    """A `Timeline` from measured events (dicts with rank, kind, microbatch, chunk, start,
    end in seconds, as `pipeline_events` reads them from a --profile trace); time 0 is the
    earliest start."""
    events = list(events)
    t0 = min((float(e["start"]) for e in events), default=0.0)
    evs = sorted((Event(int(e["rank"]), str(e["kind"]), int(e["microbatch"]),
                        int(e.get("chunk", 0)), float(e["start"]) - t0, float(e["end"]) - t0)
                  for e in events), key=lambda e: (e.rank, e.start, e.end))
    return Timeline(evs, 1 + max((e.rank for e in evs), default=-1),
                    max((e.end for e in evs), default=0.0))
