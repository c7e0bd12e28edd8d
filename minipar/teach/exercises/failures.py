"""The exercises of the failures chapter, checked (see core.py for how): the interval and
the waste model against a simulated run that fails at random (`simulated_waste`), the
steps a real run redoes after a failure, and a commit a crash must not break."""
from __future__ import annotations

import functools
import math
import posixpath
import random
import tempfile

from ...plan.config import ParallelConfig
from ...plan.config import TrainConfig
from ...runtime.run import train
from .core import (Verdict, compare_calls, exercise, function_given, predicted, reveals, right,
                   wrong, yours)
from .units import read
from ..numbers.failures import crash_table


# ----------------------------------------------------------------- a run that fails, simulated
FAILURES = 10_000      # failures per simulated run: the lost work averages to a few 0.1%


def simulated_waste(interval_s: float, write_s: float, mtbf_s: float, restart_s: float = 0.0,
                    failures: int = FAILURES, seed: int = 0) -> float:
    """The fraction of wall-clock time a run loses, simulated rather than modelled: after
    each (re)start the run computes `interval_s`, writes for `write_s`, and so on, until a
    failure (exponential, mean `mtbf_s`: seeded, so every interval meets the same failures)
    throws away the unfinished interval and its write; the restart takes `restart_s`.
    1 - the intervals completed / the wall-clock time, over `failures` failures."""
    rng = random.Random(seed)
    segment, useful, wall = interval_s + write_s, 0.0, 0.0
    for _ in range(failures):
        up = rng.expovariate(1.0 / mtbf_s)
        useful += (up // segment) * interval_s
        wall += up + restart_s
    return 1.0 - useful / wall


SCAN = [2 ** (k / 16) for k in range(-48, 49)]     # intervals tried, around sqrt(W M)


def simulated_best(write_s: float, mtbf_s: float) -> tuple[float, float]:
    """(interval, waste) of the least wasteful interval the simulation finds, scanning a
    factor of 8 either side of sqrt(write x MTBF) (a starting point, not the answer)."""
    scale = math.sqrt(write_s * mtbf_s)
    return min(((scale * f, simulated_waste(scale * f, write_s, mtbf_s)) for f in SCAN),
               key=lambda x: x[1])


BEST_WHY = "1% of the least waste the simulation finds: near its minimum the waste is flat"


@exercise("failures", "predict")
def check_young_daly_interval(write_s: float, mtbf_s: float, answer, reveal: bool = False) -> Verdict:
    """Predict the checkpoint interval, in seconds, that loses the least time when a
    checkpoint takes write_s to write and failures come every mtbf_s on average; the check
    simulates a run that fails (`simulated_waste`, ten thousand failures) at your interval
    and at intervals around it, and compares your waste with the least it finds."""
    what = "the interval"
    if answer is None and not reveal:
        return predicted(None, 0.0, what, 0.01, BEST_WHY, unit="s")
    try:
        mine = None if answer is None else read(answer, "s")
    except ValueError as e:
        return wrong(f"{what}: {e}")
    best, least = simulated_best(write_s, mtbf_s)
    if mine is None:
        return Verdict(None, f"the simulated run loses least, {least:.2%} of its time, at about "
                             f"{best:,.0f} s.")
    if mine <= 0:
        return wrong("an interval is a positive number of seconds.")
    lost = simulated_waste(mine, write_s, mtbf_s)
    report = (f"at {mine:,.0f} s the simulated run loses {lost:.2%} of its time, at the best "
              f"interval it finds {least:.2%}")
    if lost <= 1.01 * least:
        return right(f"{report} (within {BEST_WHY}).")
    for value, hint in ((math.sqrt(write_s * mtbf_s), "a factor is missing: on average a "
                         "failure loses half an interval of work, not a whole one."),
                        (60 * math.sqrt(2 * write_s * mtbf_s) / 3600, "give the interval in "
                         "seconds, not minutes.")):
        if math.isclose(mine, value, rel_tol=0.05):
            return wrong(f"{report}. Close: {hint}")
    side = "short" if mine < best else "long"
    shown_best = (f" (it is about {best:,.0f} s)" if reveals(what, mine, reveal, 0.5 < mine / best < 2)
                  else "")
    return wrong(f"{report}{shown_best}: your interval is too {side}; right is within {BEST_WHY}.")


# ----------------------------------------------------------------- find the bug: the waste model
def buggy_expected_waste(interval_s: float, write_s: float, mtbf_s: float, restart_s: float) -> float:
    """The first-order fraction of time lost, with two bugs (the exercise)."""
    return write_s / interval_s + (interval_s + write_s) / mtbf_s


# (interval, write, MTBF, restart): failures rare next to the interval, so that the
# first-order model holds; long restarts in two of them
WASTE_CASES = [(600.0, 10.0, 36000.0, 0.0), (1200.0, 30.0, 86400.0, 1800.0),
               (300.0, 5.0, 20000.0, 600.0), (3600.0, 60.0, 3 * 86400.0, 0.0)]
WASTE_REL = 0.05
WASTE_WHY = ("the model is first order: it drops terms in interval / MTBF and write / "
             "interval, a few percent here")


@exercise("failures", "bug")
def check_expected_waste(fn) -> Verdict:
    """fn(interval_s, write_s, mtbf_s, restart_s) -> the fraction of time lost, to first
    order: `buggy_expected_waste` fixed. Compared with a simulated run that fails
    (`simulated_waste`) on WASTE_CASES, within WASTE_REL."""
    return compare_calls(
        fn, WASTE_CASES, simulated_waste, WASTE_REL,
        lambda args, got, want: f"{yours(fn)}{args} returned {got:.4f}; the simulated run loses {want:.4f} "
                                f"({got / want:.2f}x; within {WASTE_REL:.0%}: {WASTE_WHY}). What "
                                f"does a failure cost: all of the interval, and nothing else?",
        f"your waste model is within {WASTE_REL:.0%} of the simulated runs ({WASTE_WHY}).")


@functools.cache
def _resumed_at(steps: int, save_every: int, fail_at_step: int) -> int:
    """Run the failing run once (per arguments) and return the step its restart resumed at."""
    with tempfile.TemporaryDirectory(prefix="minipar-exercise-") as save:
        out = train(TrainConfig(parallel=ParallelConfig(dp=2), steps=steps, progress=False,
                                save=posixpath.join(save, "ckpt"), save_every=save_every,
                                fail_at_step=fail_at_step, fail_rank=1, max_restarts=1))
    return out["failures"][0]["resumed_at_step"]


@exercise("failures", "predict")
def check_steps_computed(prediction, steps: int = 10, save_every: int = 4,
                         fail_at_step: int = 7, reveal: bool = False) -> Verdict:
    """Predict how many steps a run of `steps` computes in all (redone ones included) when
    it saves after every `save_every` steps and rank 1 dies at the start of step
    `fail_at_step`; then run it (`tiny`, two data-parallel ranks, one restart) and compare."""
    def resumed():                      # the run, once (cached), only when a verdict needs it
        return _resumed_at(steps, save_every, fail_at_step)
    return predicted(prediction, lambda: steps + fail_at_step - resumed(), "the steps computed",
                     1e-9, "a count of steps is exact", reveal=reveal,
                     details=lambda: f" The restart resumed from the checkpoint of step "
                                     f"{resumed()} and redid {fail_at_step - resumed()} step(s).")


@exercise("failures", "bug")
def check_commit(commit) -> Verdict:
    """commit(fs, root, step): make `root/step.tmp/` (the ranks' files, already written) the
    checkpoint `root/step` and point `root/latest` at it, with fs.write / fs.rename /
    fs.replace, so that a crash at ANY moment leaves `latest` naming a complete checkpoint
    and no manifest-less directory named like one (`numbers.failures.crash_table`)."""
    problem = function_given(commit)
    if problem is not None:
        return problem
    root, step = "ckpt", "step_000008"
    try:
        moments = crash_table(commit, root, step)
    except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
        return wrong(f"commit raised {type(e).__name__}: {e}")
    for when, _, broken in moments:
        if broken:
            return wrong(f"a crash {when}: {broken}.")
    latest = moments[-1][1].get(f"{root}/latest")
    if (latest or "").strip() != step:
        return wrong(f"after the commit, latest names {latest!r}, not {step!r}.")
    return right(f"a crash at any of the {len(moments)} moments leaves a usable checkpoint, "
                 f"and latest names the new one.")


__all__ = [n for n in dir() if n.startswith("check_")] + ["buggy_expected_waste"]
