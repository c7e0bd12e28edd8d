"""How often to checkpoint: the time a checkpoint interval wastes, and the intervals that
minimise it (Young 1974, Daly 2006).

Chapter "Failures at scale". Torch-free, like every file of `minipar.plan.formulas`.
"""
from __future__ import annotations

import math


def expected_waste(interval_s: float, write_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """The fraction of wall-clock time lost, to first order, when a checkpoint taking
    `write_s` is written after every `interval_s` of training and failures arrive at random
    with mean time `mtbf_s` between them: the writes cost write_s / interval_s, and each
    failure costs a restart plus, on average, half an interval (plus write) of lost work."""
    return write_s / interval_s + ((interval_s + write_s) / 2 + restart_s) / mtbf_s


def young_interval(write_s: float, mtbf_s: float) -> float:
    """The interval that minimises `expected_waste`: sqrt(2 write_s mtbf_s) (Young 1974)."""
    return math.sqrt(2 * write_s * mtbf_s)


def daly_interval(write_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum, for write times not small against the MTBF;
    it tends to Young's as write_s / mtbf_s -> 0."""
    if write_s >= 2 * mtbf_s:
        return mtbf_s
    r = write_s / (2 * mtbf_s)
    return math.sqrt(2 * write_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - write_s
