"""Shared by the exercise tests (tests/test_exercises*.py): what every check must do, said
once. It accepts the right answer, refuses each wrong one (with the words a test expects in
its message), and answers None with "Not answered yet". Also the rank-order answers several
chapters' checks are tried with, and a fixture that forgets earlier predictions."""
from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Wrong:
    """A wrong answer, and a piece of text the check's message must contain."""
    answer: object
    says: str = ""


def judged(check, right, *wrongs, args=(), **kwargs) -> list:
    """Assert that check(*args, answer, **kwargs) accepts `right`, refuses each of `wrongs`
    (an answer, or a `Wrong` whose text the message must hold), and says "Not answered yet"
    for None. Returns the wrong answers' verdicts, in order."""
    good = check(*args, right, **kwargs)
    assert good.ok is True, good.message
    verdicts = []
    for w in wrongs:
        w = w if isinstance(w, Wrong) else Wrong(w)
        verdict = check(*args, w.answer, **kwargs)
        assert verdict.ok is False and "Not quite" in repr(verdict), (w.answer, verdict.message)
        assert w.says in verdict.message, (w.says, verdict.message)
        verdicts.append(verdict)
    unanswered = check(*args, None, **kwargs)
    assert unanswered.ok is None and "Not answered yet" in repr(unanswered), unanswered.message
    return verdicts


def peeling(*axes):
    """A rank -> {axis: coordinate} function that peels the axes off the rank in this
    order, each the remainder of its size: ("tp", "cp", "pp", "dp") is the book's order
    (TP innermost); any other order is one of the usual wrong answers."""
    def coords(rank, tp, cp, pp, dp):
        sizes, out = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}, {}
        for axis in axes:
            out[axis], rank = rank % sizes[axis], rank // sizes[axis]
        return out
    return coords


@pytest.fixture
def fresh_attempts():
    """A predict check shows the run after a second, different attempt: start from none."""
    from minipar.teach.exercises import core
    core.ATTEMPTS.clear()
    yield
    core.ATTEMPTS.clear()
