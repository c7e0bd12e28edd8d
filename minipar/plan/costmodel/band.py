"""How far to trust a predicted MFU: the band that published runs of the same kind fell in.

Chapter "Four dimensions at once" (how good is the model). `evaluate` compares the model
with published runs it was never fitted to; its signed errors are what a new prediction of
the same kind can expect. The kind is the software stack (`frameworks`): a stack's kernels
and overlaps are where the model's misses come from, and each evaluation source ran one
stack (Table 4 Llama 3's, the Playbook nanotron, NVIDIA's recipes NeMo on Megatron-core).

    band = (predicted - the largest over-prediction,  predicted + the largest under-prediction)

over that stack's rows, memory-bound rows left out; a stack with fewer than `MIN_ROWS` rows
takes every row's errors. It is not a confidence interval: it is the range the published
runs landed in around what the model said of them, so that a reader never meets a
prediction "to a tenth of a point" without knowing how far off such predictions have been.
"""
from __future__ import annotations

import functools

from .evaluate import evaluated_runs, memory_bound, residuals

MIN_ROWS = 3            # fewer rows of a stack than this: the band of every row
# The evaluation rows whose stack a framework profile stands for: Megatron-LM's own runs
# and NeMo's share Megatron-core's kernels and overlaps.
KIND_OF = {"megatron": "nemo"}


@functools.cache
def errors_by_kind() -> dict[str, tuple[float, ...]]:
    """{stack: the signed errors (predicted - published, MFU points) of its rows}, and
    "all": every row's. Worked out on first use, never at import."""
    runs = evaluated_runs()
    kept = [(run, r) for run, r in zip(runs, residuals(runs)) if not memory_bound(run)]
    out: dict[str, list[float]] = {"all": [r for _, r in kept]}
    for run, r in kept:
        out.setdefault(run.framework, []).append(r)
    return {k: tuple(v) for k, v in out.items()}


def band_errors(framework: str | None) -> tuple[str, tuple[float, ...]]:
    """(the kind whose errors are used, those errors) for a run under `framework`."""
    kind = KIND_OF.get(framework, framework)
    errors = errors_by_kind()
    if kind in errors and len(errors[kind]) >= MIN_ROWS:
        return kind, errors[kind]
    return "all", errors["all"]


def mfu_band(mfu: float, framework: str | None = None) -> tuple[float, float]:
    """(low, high) MFU around the prediction `mfu` (a fraction), from the evaluation's errors
    for runs under `framework` (`band_errors`)."""
    _, errors = band_errors(framework)
    low, high = mfu - max(errors) / 100, mfu - min(errors) / 100
    return max(0.0, low), min(1.0, high)


def band_note(framework: str | None) -> str:
    """Where a band comes from, in a few words, for the CLI and the book."""
    kind, errors = band_errors(framework)
    rows = f"{len(errors)} published runs" + ("" if kind == "all" else f" under {kind}")
    return (f"the range {rows} fell in around the model's prediction "
            f"(errors {min(errors):+.1f} to {max(errors):+.1f} points)")
