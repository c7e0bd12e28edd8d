"""The exercises of the failures chapter, checked (see core.py for how)."""
from __future__ import annotations

import math

from ...checkpoint import expected_waste
from .core import Verdict, compare_calls, exercise, number


@exercise("failures", "number")
def check_young_daly_interval(write_s: float, mtbf_s: float, answer) -> Verdict:
    """Young's optimal checkpoint interval, in seconds."""
    want = math.sqrt(2 * write_s * mtbf_s)
    return number(answer, want, "the interval in seconds", rel=5e-3, hints=[
        (math.sqrt(write_s * mtbf_s), "missing a factor: the interval is sqrt(2 C M)."),
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
        "your waste model matches minipar.checkpoint.expected_waste.")


__all__ = [n for n in dir() if n.startswith("check_")]
