"""The exercises of the pipeline parallelism chapter, checked (see core.py for how).

Schedules are checked symbolically first, by the same functions that check minipar's own
(`check_schedule`, `simulate`, `schedule_analysis.peak_in_flight`, and `p2p_plan`
replayed with blocking sends by `schedule_analysis.check_p2p_plan`). The predict-then-run
exercises compare the reader's prediction with what minipar gives: the simulator, for a bubble
the chapter does not compute (transfers that take time), and the executor on real gloo ranks,
for the activations a rank holds at once, counted from the actions the run recorded.
"""
from __future__ import annotations

import contextlib
import functools
import tempfile

from ...plan import traces
from ...plan.config import ParallelConfig
from ...plan.config import TrainConfig
from ...plan.schedule_analysis import (check_p2p_plan, peak_in_flight, pipeline_events,
                                       timeline_from_events)
from ...plan.schedules import Action, ScheduleError, make_schedule, p2p_plan, simulate
from ...trainer.parallel import pipeline
from ...runtime.run import train
from .. import replays
from .core import (REPLAY_WHY, Verdict, apart, compare_calls, exercise, function_given, predicted,
                   right, wrong, yours)


# ----------------------------------------------------------------- predict, then simulate
T_F, T_B = 1.0, 2.0            # the chapter's times: a backward takes twice a forward


def simulated_bubble(p: int, m: int, schedule: str = "1f1b", t_comm: float = 0.0) -> float:
    """The bubble fraction minipar's simulator gives `schedule` (t_f = 1, t_b = 2, and
    `t_comm` for each message between ranks)."""
    return simulate(make_schedule(schedule, p, m), T_F, T_B, 0.0, t_comm).bubble_fraction


@exercise("pipeline_parallel", "predict")
def check_bubble(p: int, m: int, prediction, schedule: str = "1f1b", t_comm: float = 0.5,
                 reveal: bool = False) -> Verdict:
    """Predict the bubble fraction of `schedule` with p stages and m micro-batches, a forward
    taking 1, a backward 2 and each message between neighbouring ranks `t_comm`; the check
    builds the schedule (`make_schedule`) and runs it in minipar's simulator (`simulate`).
    Messages must take time (t_comm > 0): without them the answer is the chapter's formula."""
    what = "the bubble fraction"
    if prediction is None and not reveal:
        return predicted(None, 0.0, what, 1e-3, "")
    if t_comm <= 0:
        return wrong("with messages that take no time the bubble is the chapter's formula: "
                     "this exercise is about transfers, give t_comm > 0.")
    timed = simulate(make_schedule(schedule, p, m), T_F, T_B, 0.0, t_comm)
    truth = timed.bubble_fraction
    hints = [(truth / (1 - truth), "that is idle over busy time; the fraction is idle over "
                                   "the whole area, makespan x ranks.")]
    if t_comm:
        free = simulate(make_schedule(schedule, p, m), T_F, T_B)      # the same, messages free
        hints += [(free.bubble_fraction * free.makespan / timed.makespan, "a rank waiting "
                   "for a message is idle too: the transfers belong in the bubble, not only in "
                   "the step."),
                  (free.bubble_fraction, "that is the bubble without transfers: "
                   "what does a message between stages add to the fill and the drain?"),
                  (simulated_bubble(p, m, schedule, t_comm / 2), "the transfers count on both "
                   "passes: the forwards fill the pipeline and the backwards drain it, and "
                   "each crosses the stage boundaries.")]
    details = ""
    if t_comm and schedule != "1f1b":
        other = simulated_bubble(p, m, "1f1b", t_comm)
        details = (f" 1F1B, the same bubble without transfers, idles {other:.1%} here: in its "
                   "steady state a rank's next backward must first come back from the stages "
                   "after it, a message per boundary each way, and its short warm-up leaves "
                   "it nothing to do meanwhile (Megatron's longer warm-up is for this).")
    return predicted(prediction, truth, what, 1e-3,
                     "the simulator times every action exactly", reveal=reveal,
                     hints=[h for h in hints if abs(h[0] - truth) > 1e-9], details=details,
                     against=f"the simulated {schedule.upper()}")


@exercise("pipeline_parallel", "implement")
def check_interleaved_bubble(fn) -> Verdict:
    """fn(p, m, v) -> the bubble fraction of interleaved 1F1B, v chunks per rank."""
    return compare_calls(
        fn, [(2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 6, 1)],
        lambda p, m, v: simulate(make_schedule("interleaved", p, m, v)).bubble_fraction, 1e-6,
        lambda args, got, want: f"{yours(fn)}{args} returned {got:.4f}, but the simulated schedule idles "
                                f"{want:.4f} of the time.",
        "your formula matches the simulated interleaved schedules.")


# ----------------------------------------------------------------- a schedule generator
# (p, m): deep and shallow pipelines, m a multiple of p or not, and m < p
ONE_F_ONE_B_CASES = ((2, 4), (4, 8), (3, 5), (4, 2))


def _as_actions(schedule) -> list[list[Action]]:
    return [[a if isinstance(a, Action) else Action(*a) for a in acts] for acts in schedule]


def _one_f_one_b_problem(schedule, p: int, m: int) -> str | None:
    """What is wrong with `schedule` as 1F1B for (p, m), or None: every action once and in
    order, the makespan (m + p - 1)(t_f + t_b) for two ratios, at most p - r micro-batches in
    flight on rank r, and a message order that cannot deadlock."""
    if len(schedule) != p:
        return f"{len(schedule)} rank lists for p = {p}"
    try:
        for t_f, t_b in ((1.0, 2.0), (1.0, 1.0)):
            tl = simulate(schedule, t_f, t_b)
            want = (m + p - 1) * (t_f + t_b)
            if abs(tl.makespan - want) > 1e-9:
                return (f"with t_f = {t_f:g}, t_b = {t_b:g} the step takes {tl.makespan:g}, "
                        f"1F1B's takes (m + p - 1)(t_f + t_b) = {want:g}")
        check_p2p_plan(p2p_plan(schedule))
    except (ScheduleError, RuntimeError) as e:
        return str(e)
    peak, bound = peak_in_flight(schedule), [min(p - r, m) for r in range(p)]
    if any(a > b for a, b in zip(peak, bound)):
        return f"micro-batches in flight per rank {peak}; 1F1B holds at most {bound}"
    return None


@contextlib.contextmanager
def executing(schedule):
    """minipar's executor runs `schedule` (whatever --schedule says) while inside: the
    forked ranks of a `train` call inherit the swapped plan."""
    original = pipeline.plan_of
    pipeline.plan_of = lambda *_: p2p_plan(schedule)
    try:
        yield
    finally:
        pipeline.plan_of = original


RUN_P, RUN_M, STEPS = 2, 4, 2      # the run on ranks: tiny, 2 pipeline ranks, 4 micro-batches


def _losses(pp: int = 1) -> list[float]:
    cfg = TrainConfig(parallel=ParallelConfig(pp=pp, microbatches=RUN_M if pp > 1 else 1),
                      global_batch=RUN_M, seq_len=32, steps=STEPS, progress=False)
    return [r["loss"] for r in train(cfg)["records"]]


def _run_on_ranks(schedule) -> str | None:
    """Train `tiny` for STEPS steps on RUN_P pipeline ranks with `schedule`; None when its
    losses are one device's (float32: 1e-5 relative), else what differs."""
    with executing(schedule):
        got = _losses(RUN_P)
    for step, (a, b) in enumerate(zip(got, _losses())):
        if abs(a - b) > 1e-5 * abs(b):
            return f"on {RUN_P} gloo ranks, step {step}: loss {a:.6f}, one device {b:.6f}"
    return None


@exercise("pipeline_parallel", "schedule")
def check_one_f_one_b(fn) -> Verdict:
    """fn(p, m) -> one list of actions per rank (`Action("F", i)` or ("F", i) tuples) for
    1F1B: checked by the simulator (validity, makespan, memory) and the p2p plan, then run
    by minipar's executor on 2 gloo ranks against one device's losses."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for p, m in ONE_F_ONE_B_CASES:
        try:
            schedule = _as_actions(fn(p, m))
        except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
            return wrong(f"{yours(fn)}({p}, {m}) raised {type(e).__name__}: {e}")
        problem = _one_f_one_b_problem(schedule, p, m)
        if problem:
            return wrong(f"p = {p}, m = {m}: {problem}")
    problem = _run_on_ranks(_as_actions(fn(RUN_P, RUN_M)))
    if problem:
        return wrong(problem)
    return right(f"your schedule is 1F1B for every (p, m) in {list(ONE_F_ONE_B_CASES)}: the "
                 "simulator's step, at most p - r in flight, a deadlock-free message order; "
                 f"and run on {RUN_P} gloo ranks it gives one device's losses.")


# ----------------------------------------------------------------- predict, then run
@functools.lru_cache(maxsize=4)
def measured_pipeline(schedule: str = "1f1b", p: int = 2, m: int = 4, steps: int = 2):
    """Run `steps` of `tiny` on p pipeline ranks (gloo) with `--profile`, and return the last
    step's measured timeline."""
    path = tempfile.mkdtemp(prefix="minipar-pp-")
    train(TrainConfig(parallel=ParallelConfig(pp=p, schedule=schedule, microbatches=m),
                      global_batch=2 * m, seq_len=64, steps=steps, progress=False, profile=path))
    events = pipeline_events(traces.load(path))
    last = max(e["step"] for e in events)
    return timeline_from_events([e for e in events if e["step"] == last])


def measured_durations(tl) -> tuple[float, float]:
    """Mean forward and backward time of one action in a measured timeline."""
    mean = lambda k: sum(e.end - e.start for e in tl.events if e.kind == k) / max(  # noqa: E731
        1, sum(e.kind == k for e in tl.events))
    return mean("F"), mean("B")


def measured_in_flight(tl, rank: int = 0) -> int:
    """The most micro-batches whose activations `rank` held at once in a measured timeline:
    forwards ended minus backwards ended, action by action as the rank ran them."""
    held = peak = 0
    for e in sorted((e for e in tl.events if e.rank == rank), key=lambda e: e.start):
        held += 1 if e.kind == "F" else -1 if e.kind == "B" else 0
        peak = max(peak, held)
    return peak


@exercise("pipeline_parallel", "predict")
def check_predict_in_flight(prediction, schedule: str = "1f1b", p: int = 2, m: int = 4,
                            measured: int | None = None, reveal: bool = False) -> Verdict:
    """Predict the most micro-batches whose activations rank 0 holds at once (its forward
    done, its backward not yet) under `schedule` with p ranks and m micro-batches; minipar
    then runs it on p gloo ranks with --profile and counts from the recorded actions (or
    takes `measured`). The verdict also shows the run's bubble, and what the simulator
    gives fed with the run's own mean action times."""
    def details():
        tl = measured_pipeline(schedule, p, m)
        t_f, t_b = measured_durations(tl)
        fed = simulate(make_schedule(schedule, p, m), t_f, t_b).bubble_fraction
        return (f" The run's bubble is {tl.bubble_fraction:.3f}; the simulator fed with its mean "
                f"F and B ({t_f * 1e3:.1f} and {t_b * 1e3:.1f} ms) gives {fed:.3f}: the rest is "
                "time no action accounts for (transfers, Python, cores shared with other work).")
    run = (lambda: measured_in_flight(measured_pipeline(schedule, p, m))) if measured is None else measured
    hints = [(float(m), "that is all m: AFAB's, whose forwards all run first. Which "
                        "backward can rank 0 start before its last forward?"),
             (1.0, "that is the last rank's: rank 0 starts a backward only once its first "
                   "micro-batch has gone through every later stage and come back.")]
    if schedule != "1f1b":
        hints = []
    return predicted(prediction, run, "rank 0's micro-batches in flight", 1e-9,
                     "the run's actions are counted exactly", reveal=reveal, hints=hints,
                     details=details if measured is None else "")


# ---------------------------------------------------------------- predict, then replay
@exercise("pipeline_parallel", "predict")
def check_replayed_bubble(prediction, reveal: bool = False) -> Verdict:
    """Predict the bubble fraction of 1F1B with p = 4 and m = 8 (`--pp 4 --microbatches 8`)
    replayed at Llama 3 8B's shapes on H100s, where the last stage also computes the output
    head and the loss; the check replays it (`teach.replays`, the chapter's figure)."""
    what = "the replayed 1F1B bubble"
    if prediction is None and not reveal:
        return predicted(None, 0.0, what, 0.1, REPLAY_WHY)
    truth = replays.replayed("pipeline_parallel").bubble_fraction
    formula = replays.estimated("pipeline_parallel").bubble_fraction
    hints = [(formula, "that is (p-1)/(m+p-1), for equal stages. The last stage is slower (the "
                       "head and the loss): in the steady state every stage waits for it, and "
                       "the first micro-batch still fills, the last drains, through the others."),
             (truth / (1 - truth), "that is idle over busy time; the fraction is idle over "
                                   "the whole area, makespan x ranks.")]
    inter = replays.replayed("pipeline_parallel_interleaved").bubble_fraction
    details = f" Interleaved with v = 2, the same run's replayed bubble is {inter:.0%}."
    return predicted(prediction, truth, what, 0.1, REPLAY_WHY, reveal=reveal,
                     hints=apart(hints, truth, 0.1), details=details, against="the replay")


__all__ = [n for n in dir() if n.startswith("check_")]
