"""`%%solution`: a worked solution that proves itself without giving itself away.

Every chapter's notebook uses it: each exercise is followed by its worked solution, folded.
A folded cell still shows its first line, and a solution cell that ran shows its output: if
that line were the solution's idea, or the output its number ("Correct! ... 1.88 GB"), the
fold would hide nothing, and Run All would print it under the reader's own "Not quite". Run
All would also replace the reader's `prediction` or `dp_group` with the solution's. So a
solution cell starts with `%%solution`, which

- runs the cell in a copy of the reader's namespace: what the solution assigns or defines
  stays in the copy, and the reader's answers stand (a shallow copy: an object the solution
  changed in place would change for the reader too; no solution does that);
- keeps what the cell prints or displays, and shows none of it when the solution is right;
- takes the cell's last line as its verdict: an expression, or `assert` of one, whose
  value is a right `Verdict`. Then the cell prints one line that names the check and not
  the answer. A solution that raises, or whose verdict is not right, raises
  `SolutionFailed` with everything the cell printed, so nbval fails loudly on it.

It behaves the same in a reader's kernel and under nbval, so the committed output is that
one line. Importing `minipar.teach.exercises` in IPython registers it; outside IPython the
import costs nothing (IPython is never imported here), and `%load_ext
minipar.teach.exercises` registers it by hand.
"""
from __future__ import annotations

import ast
import sys

from .core import Verdict


class SolutionFailed(Exception):
    """A worked solution that raised, or whose verdict is not right."""


def _shown(captured) -> str:
    """What the solution printed or displayed, as text for the error."""
    parts = [captured.stdout, captured.stderr]
    parts += [o.data.get("text/plain", "") for o in captured.outputs]
    text = "".join(p if p.endswith("\n") else p + "\n" for p in parts if p)
    return text or "(nothing)\n"


def _verdict_expression(body: list[ast.stmt]) -> ast.expr:
    """The expression of the cell's last line: `check_x(...)` or `assert check_x(...)`."""
    last = body[-1] if body else None
    if isinstance(last, ast.Expr):
        return last.value
    if isinstance(last, ast.Assert):
        return last.test
    raise SolutionFailed("a %%solution cell ends in its check: check_x(...) or "
                         "assert check_x(...)")


def _check_name(expression: ast.expr) -> str:
    """`check_x` for `check_x(...)` or `exercises.check_x(...)`, else ''."""
    func = expression.func if isinstance(expression, ast.Call) else None
    return getattr(func, "id", None) or getattr(func, "attr", None) or ""


def passed_line(check: str) -> str:
    """The one line a right solution prints: the check it passes, never its answer."""
    passes = f"it passes {check}" if check else "it passes its check"
    return f"Solution: {passes}. Click the bar at the cell's left to read it."


def run_solution(source: str, namespace: dict) -> str:
    """Run a solution cell's `source` in `namespace` (the caller passes a copy), its
    output captured; the line to print when its last line is a right verdict, else
    SolutionFailed with the output."""
    from IPython.utils.capture import capture_output   # only a notebook's kernel runs this

    body = ast.parse(source).body
    expression = _verdict_expression(body)
    steps = compile(ast.Module(body[:-1], type_ignores=[]), "<solution>", "exec", dont_inherit=True)
    last = compile(ast.Expression(expression), "<solution>", "eval", dont_inherit=True)
    with capture_output() as captured:        # stdout, stderr and IPython's displays
        try:
            exec(steps, namespace)
            verdict = eval(last, namespace)
        except Exception as e:   # noqa: BLE001 - whatever the solution raised, with its output
            problem, cause = f"it raised {type(e).__name__}: {e}", e
        else:
            problem, cause = None, None
            if not isinstance(verdict, Verdict):
                problem = f"its last line gave {type(verdict).__name__}, not a check's Verdict"
            elif not verdict:
                problem = f"its verdict is not right: {verdict}"
    if problem:
        raise SolutionFailed(f"The worked solution fails: {problem}\nIt printed:\n"
                             f"{_shown(captured)}") from cause
    return passed_line(_check_name(expression))


def load_ipython_extension(ipython) -> None:
    """Register the `%%solution` cell magic in `ipython`."""
    def solution(line, cell):
        """Run this worked solution in a copy of the namespace, its output kept back; print
        one line if its last line is a right verdict, else raise SolutionFailed."""
        source = ipython.transform_cell(cell)            # IPython syntax, as in any cell
        print(run_solution(source, dict(ipython.user_ns)))
    ipython.register_magic_function(solution, magic_kind="cell", magic_name="solution")


def register_in_ipython() -> None:
    """Register `%%solution` when this runs inside IPython; nothing otherwise."""
    if "IPython" not in sys.modules:      # not in IPython, and importing it would cost
        return
    from IPython import get_ipython
    ipython = get_ipython()
    if ipython is not None:
        load_ipython_extension(ipython)
