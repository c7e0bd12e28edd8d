"""The exercises of the failures chapter, checked (see core.py for how)."""
from __future__ import annotations

import functools
import math
import posixpath
import tempfile

from ...plan.config import ParallelConfig
from ...plan.config import TrainConfig
from ...plan.formulas.failures import expected_waste
from ...runtime.run import train
from .core import Verdict, compare_calls, exercise, function_given, predicted, right, wrong
from ..numbers.failures import crash_table


def best_interval(write_s: float, mtbf_s: float) -> float:
    """The interval that minimises `expected_waste` (no restart cost: it does not move the
    minimum), found by golden-section search on the waste model itself, not by a formula."""
    lo, hi = 1e-3 * write_s, 10 * mtbf_s                  # the waste is convex in between
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if expected_waste(a, write_s, mtbf_s, 0.0) < expected_waste(b, write_s, mtbf_s, 0.0):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


@exercise("failures", "predict")
def check_young_daly_interval(write_s: float, mtbf_s: float, answer, reveal: bool = False) -> Verdict:
    """Predict the checkpoint interval, in seconds, that loses the least time when a
    checkpoint takes write_s to write and failures come every mtbf_s on average; the check
    minimises the chapter's waste model (`expected_waste`) numerically and compares."""
    want = best_interval(write_s, mtbf_s)
    return predicted(answer, want, "the interval", 5e-3, "the search finds the minimum to "
                     "far better than that", unit="s", reveal=reveal,
                     against="the waste model's minimum", hints=[
        (math.sqrt(write_s * mtbf_s), "close, but a factor is missing: on average a failure "
                                      "loses half an interval of work, not a whole one."),
        (want / 60, "give the interval in seconds, not minutes."),
    ])


@exercise("failures", "implement")
def check_expected_waste(fn) -> Verdict:
    """fn(interval_s, write_s, mtbf_s, restart_s) -> fraction of time lost (first order)."""
    return compare_calls(
        fn, [(600.0, 30.0, 3 * 3600.0, 0.0), (1200.0, 60.0, 11134.0, 300.0),
             (60.0, 5.0, 600.0, 20.0)], expected_waste, 1e-9,
        lambda args, got, want: f"fn{args} = {got:.5f}, expected another value (off by "
                                f"{got - want:+.5f}); count the writes, the restart and the "
                                f"lost work.",
        "your waste model matches minipar.plan.formulas.failures.expected_waste.")


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


__all__ = [n for n in dir() if n.startswith("check_")]
