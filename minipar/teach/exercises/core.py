"""How every exercise is checked: one fixed signature per exercise, a verdict, and for code
an independent reference run on real gloo ranks.

A check takes the reader's answer (a number) or implementation (a function with the
signature the exercise states) and returns a `Verdict`, one line: "Not answered yet" for
None, "Correct" for a right answer, and for a wrong one what is off, never the solution.
A number is right within a relative tolerance every verdict states, and may come with its
unit ("50.7 GB", read by `units`). Code is run on `world` gloo ranks against the
single-device reference, at every step; a wrong tensor is reported by step, rank and name,
with its first wrong element and the largest difference, against a tolerance that says why
it is what it is.

Every check is registered with `@exercise(chapter, kind)`, so the tests can ask each
chapter for its exercises and the book cannot name a check that does not exist. Kinds:
- "number":    compute a number from the chapter's model;
- "predict":   predict a number from the chapter's model, then run minipar and compare
               (the check reports the ratio of the run to the prediction, once the
               prediction is a reasonable attempt or the reader asks: `reveals`);
- "bug":       a broken variant (teach/exercises/variants) to find and fix;
- "implement": write the piece with torch.distributed / autograd;
- "schedule":  build an action list, checked by the simulator before it runs on ranks;
- "design":    propose a layout for a given model and cluster; the memory model, the
               placement on servers and pods, and the planner critique it (`critique`).

No check grades a number by the closed form the chapter prints above it: a prediction is
compared with a run, a simulation or a count of the real model; a formula to write is a
broken variant to fix, compared with what minipar runs.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from .. import replays

from ...runtime.launch import RankFailed, run_local
from .units import read, shown, wanted

NOT_ANSWERED = "Not answered yet: replace None with your answer and run the cell again."
KINDS = ("number", "predict", "bug", "implement", "schedule", "design")
REGISTRY: dict[str, tuple[str, str]] = {}    # check name -> (chapter, kind)


def exercise(chapter: str, kind: str):
    """Register a check under its chapter (the notebook's name) and kind."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")

    def register(check):
        if check.__name__ in REGISTRY:   # `from .x import *` would silently keep one of two
            raise ValueError(f"two exercise checks are named {check.__name__}: "
                             f"{REGISTRY[check.__name__][0]} and {chapter}")
        REGISTRY[check.__name__] = (chapter, kind)
        return check
    return register


def exercises_of(chapter: str) -> dict[str, str]:
    """{check name: kind} of one chapter."""
    return {name: kind for name, (ch, kind) in REGISTRY.items() if ch == chapter}


class Verdict:
    """The outcome of a check: ok is True (right), False (wrong) or None (no answer yet).
    A notebook cell shows its message; `print(check_x(...))` prints the same one line."""

    def __init__(self, ok: bool | None, message: str):
        self.ok, self.message = ok, message

    def __bool__(self) -> bool:      # `assert check_x(...)` passes only when it is right
        return self.ok is True

    def __repr__(self) -> str:       # what a notebook cell shows
        return self.message

    __str__ = __repr__


def right(message: str) -> Verdict:
    return Verdict(True, "Correct! " + message)


def wrong(message: str) -> Verdict:
    return Verdict(False, "Not quite: " + message)


def tolerance(rel: float) -> str:
    """How a verdict states a check's relative tolerance."""
    return f"{100 * rel:g}%" if rel >= 1e-4 else f"one part in {1 / rel:,.0f}"


def unanswered(what: str, unit: str, rel: float, then: str = "") -> Verdict:
    """No answer yet: what to write, in which unit, and how close counts as right."""
    return Verdict(None, f"Not answered yet: replace None with {what}, {wanted(unit)}, and run "
                         f"the cell again{then}. Within {tolerance(rel)} is right.")


def _off(a: float, expected: float, unit: str) -> str:
    """How far a wrong number is: in percent when close, as a factor when far."""
    side = "too high" if a > expected else "too low"
    ratio = a / expected if expected else math.inf
    if not 0.5 <= ratio <= 2:
        return f"{side} by a factor of {max(ratio, 1 / ratio):.3g}"
    if abs(ratio - 1) < 1e-4:
        return f"{side} by {shown(abs(a - expected), unit)}"
    return f"{100 * abs(ratio - 1):.2g}% {side}"


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def number(answer, expected: float, what: str, rel: float = 1e-3, hints=(), unit: str = "") -> Verdict:
    """Compare a numeric answer with `expected` to relative tolerance `rel`, which every
    verdict states. `unit`: the unit of `expected` (a key of units.UNITS, "" for a plain
    number); a plain number is read in it, a string such as "50.7 GB" converted to it.

    hints: (value, message) pairs for the usual mistakes; a wrong answer near one of them
    gets that message, any other says how far off it is, never the answer.
    """
    if answer is None:
        return unanswered(what, unit, rel)
    try:
        a = read(answer, unit)
    except ValueError as e:
        return wrong(f"{what}: {e}")
    if _close(a, expected, rel):
        return right(f"({what}, within {tolerance(rel)})")   # not the number: the page shows this
    for value, message in hints:
        if _close(a, value, rel):
            return wrong(message)
    return wrong(f"{what} = {shown(a, unit)} is {_off(a, expected, unit)}; the check accepts "
                 f"answers within {tolerance(rel)}.")


# ---------------------------------------------------------------- predict, then run
# A predicted number is compared with a run, and the run's number is the answer: it is shown
# only after a reasonable attempt (within a factor of 2, or a second, different prediction)
# or on request (reveal=True), never after a first wild guess.
REVEAL_FACTOR = 2.0
ATTEMPTS: dict[str, set] = {}      # what -> the attempts made so far


def near(guess: float, truth: float) -> bool:
    """A reasonable attempt: within a factor of REVEAL_FACTOR of the truth."""
    return guess > 0 and 1 / REVEAL_FACTOR <= truth / guess <= REVEAL_FACTOR


def reveals(what: str, guess, reveal: bool = False, close: bool = False) -> bool:
    """Whether a wrong attempt `guess` at `what` may see the answer: on request (`reveal`),
    when `close` (a reasonable attempt), or from the second, different attempt on. Records
    the attempt, so running the same cell again is not a second try."""
    earlier = ATTEMPTS.setdefault(what, set()) - {guess}
    ATTEMPTS[what].add(guess)
    return reveal or close or bool(earlier)


def hidden(what: str, guess: float, truth: float, unit: str, rel: float, why: str,
           against: str = "what minipar measured") -> Verdict:
    """A first, far-off prediction: which side it is on, not the run's number."""
    side = "above" if guess > truth else "below"
    return wrong(f"{what} = {shown(guess, unit)} is more than a factor of {REVEAL_FACTOR:g} "
                 f"{side} {against} (within {tolerance(rel)} is right: {why}). Try "
                 f"again: the run's number shows once you are within a factor of "
                 f"{REVEAL_FACTOR:g}, from your second prediction on, or with reveal=True.")


def predicted(prediction, measured, what: str, rel: float, why: str, unit: str = "",
              reveal: bool = False, hints=(), details="",
              against: str = "what minipar measured") -> Verdict:
    """A predict-then-run exercise: the reader's prediction against a number minipar
    measures. `measured` is that number, or a function that runs minipar and returns it:
    called only once there is a prediction (or reveal=True), so an unanswered exercise runs
    nothing. Within `rel` (whose reason `why` states) is right; a wrong prediction near a
    hint's value gets its message; otherwise the verdict reports run / prediction when
    `reveals` allows it, appending `details` (more about the run: a string, or a function
    called after the run) then too."""
    if prediction is None and not reveal:
        return unanswered(f"your prediction of {what}", unit, rel, "; the check then runs "
                          "minipar and compares (reveal=True shows the run without a prediction)")
    try:
        p = None if prediction is None else read(prediction, unit)
    except ValueError as e:
        return wrong(f"{what}: {e}")
    for value, message in hints:
        if p is not None and _close(p, value, rel):
            ATTEMPTS.setdefault(what, set()).add(p)
            return wrong(message)
    m = measured() if callable(measured) else measured
    details = details() if callable(details) else details
    if p is None:
        return Verdict(None, f"minipar measured {what} = {shown(m, unit)} (no prediction to "
                             f"compare).{details}")
    ratio = m / p if p else math.inf
    report = (f"{what}: run / prediction = {shown(m, unit)} / {shown(p, unit)} = "
              + (f"{ratio:.4f}" if abs(ratio) < 10 else f"{ratio:.3g}"))
    if _close(p, m, rel):
        return right(f"{report} (within {tolerance(rel)}: {why}).{details}")
    if not reveals(what, p, reveal, near(p, m)):
        return hidden(what, p, m, unit, rel, why, against)
    return wrong(f"{report}; more than {tolerance(rel)} apart ({why}).{details}")


# A replayed number (`minipar.replay`) splits a layer's time over its collectives in
# proportion to the CPU's timing of the recorded run, so it moves by a few percent from one
# recording to the next: the replay checks accept 15%, and say why.
REPLAY_WHY = ("the replay splits a layer's time over its collectives as the CPU's timing of "
              "the recorded run did, which varies by a few percent from run to run")


def apart(hints, truth: float, rel: float) -> list:
    """The hints (value, message) far enough from `truth` that a right answer never gets
    one's message (a hint is matched within `rel` of its value)."""
    return [(v, m) for v, m in hints if not math.isclose(v, truth, rel_tol=2 * rel)]


def replayed_exposure(prediction, reveal: bool, what: str, run: str, axis: str, clues) -> Verdict:
    """A predicted exposed time of `axis` (ms per step) against the replay of `run`
    (`teach.replays`), within 15%. `clues(truth_ms)` gives the hints and the details once
    the replay is known: (hints [(value, message)], details)."""
    if prediction is None and not reveal:
        return predicted(None, 0.0, what, 0.15, REPLAY_WHY, unit="ms")
    truth = replays.replayed(run).exposed_s[axis] * 1e3
    hints, details = clues(truth)
    return predicted(prediction, truth, what, 0.15, REPLAY_WHY, unit="ms", reveal=reveal,
                     hints=apart(hints, truth, 0.15), details=details, against="the replay")


def function_given(fn) -> Verdict | None:
    """None when `fn` is a function to run, else the verdict that says why not."""
    if fn is None:
        return Verdict(None, "Not answered yet: write the function, pass it here, run again.")
    if not callable(fn):
        return wrong(f"expected a function, got {fn!r}.")
    return None


def yours(fn) -> str:
    """How a verdict names the reader's function: by its own name ("your dp_group"), or
    "your function" for a lambda or a partial, which have none to show."""
    name = getattr(fn, "__name__", "")
    return f"your {name}" if name.isidentifier() else "your function"


def compare_calls(fn, cases, reference, rel_tol: float, mismatch, success: str,
                  call=None) -> Verdict:
    """Call the reader's fn(*args) and reference(*args) for each args in `cases`. Wrong at the
    first call that raises, or whose number is off by more than rel_tol (mismatch(args, got,
    want) says how); right, saying `success`, when every case agrees. call(args) names a call
    in the messages (default: "your fn_name(args...)", see `yours`)."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for args in cases:
        want = reference(*args)
        name = call(args) if call else f"{yours(fn)}({', '.join(map(repr, args))})"
        try:
            got = float(fn(*args))
        except Exception as e:   # noqa: BLE001 - the reader's code may raise anything
            return wrong(f"{name} raised {type(e).__name__}: {e}")
        if not math.isclose(got, want, rel_tol=rel_tol):
            return wrong(mismatch(args, got, want))
    return right(success)


# ---------------------------------------------------------------- tensors, compared
@dataclass(frozen=True)
class Tolerance:
    """How close is equal, and why: every check states its reason."""
    atol: float
    rtol: float
    why: str


BITWISE = Tolerance(0.0, 0.0, "bitwise: the same operations in the same order")
FLOAT32 = Tolerance(1e-5, 1e-5, "float32: the same sums in another order round differently")


def first_difference(got, want, name: str, tol: Tolerance = FLOAT32) -> str | None:
    """None when `got` equals `want` within `tol`; else the tensor's name, its first wrong
    element (index, got, want) and the largest difference."""
    if not isinstance(got, torch.Tensor):
        return f"{name} should be a tensor, got {type(got).__name__}."
    if got.shape != want.shape:
        return f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}."
    got, want = got.detach().double(), want.detach().double()
    bad = ~torch.isclose(got, want, rtol=tol.rtol, atol=tol.atol, equal_nan=False)
    if not bad.any():
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    diff = (got - want).abs().max().item()
    return (f"{name}{list(index)} = {got[index].item():.6g}, expected {want[index].item():.6g}"
            f"; max |difference| {diff:.3g} over {int(bad.sum())} of {bad.numel()} elements"
            f" (tolerance {tol.atol:g}: {tol.why}).")


def at(step: int, rank: int, problem: str | None) -> str | None:
    """Prefix a tensor's problem with the step and rank where it showed."""
    return None if problem is None else f"step {step}, rank {rank}: {problem}"


def on_ranks(world: int, worker, fn, success: str, timeout_s: float = 60.0) -> Verdict:
    """Run `worker(fn)` on `world` local gloo ranks. Each returns None (fine) or what went
    wrong (use `at` and `first_difference`); the verdict shows the first rank's problem."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for attempt in (1, 2):
        try:
            problems = run_local(_quiet, world, worker, fn, backend="gloo", timeout_s=timeout_s)
            break
        except RankFailed as e:
            first = str(e).strip().splitlines()[0]
            if e.raised:                  # an exception, most likely in the reader's code
                return wrong(f"your code raised on rank {e.rank}: {first}")
            if attempt == 2:
                return wrong(f"rank {e.rank} did not finish, twice: {first}")
            # A rank that died or stopped beating without raising: on a loaded machine a
            # forked rank can stall; one fresh start tells that apart from a real hang.
    problems = [p for p in problems if p]
    if problems:
        return wrong(problems[0])
    return right(success)


def _quiet(worker, fn):
    warnings.simplefilter("ignore", FutureWarning)   # torch's deprecation notes, per rank
    return worker(fn)
