"""The exercises of the pipeline parallelism chapter, checked (see core.py for how)."""
from __future__ import annotations

from ...parallel.schedules import make_schedule, simulate
from .core import Verdict, compare_calls, exercise, number


@exercise("pipeline_parallel", "number")
def check_bubble(p: int, m: int, answer, schedule: str = "1f1b") -> Verdict:
    """The bubble fraction of `schedule` with p stages and m micro-batches (t_b = 2 t_f)."""
    want = simulate(make_schedule(schedule, p, m)).bubble_fraction
    return number(answer, want, "the bubble fraction", rel=1e-3, hints=[
        ((p - 1) / m, "that is idle over busy time; the fraction is idle over the whole "
                      "area, makespan x ranks."),
        ((p - 1) / (m + p), "nearly: the pipeline fills and drains over p-1 slots."),
    ])


@exercise("pipeline_parallel", "implement")
def check_interleaved_bubble(fn) -> Verdict:
    """fn(p, m, v) -> the bubble fraction of interleaved 1F1B, v chunks per rank."""
    return compare_calls(
        fn, [(2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 6, 1)],
        lambda p, m, v: simulate(make_schedule("interleaved", p, m, v)).bubble_fraction, 1e-6,
        lambda args, got, want: f"fn{args} = {got:.4f}, but the simulated schedule idles "
                                f"{want:.4f} of the time.",
        "your formula matches the simulated interleaved schedules.")


__all__ = [n for n in dir() if n.startswith("check_")]
