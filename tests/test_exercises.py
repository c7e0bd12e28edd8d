"""Every exercise check accepts the right answer, rejects a wrong one, and shrugs at None."""
import ast
import functools
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from minipar.teach import exercises as E
from minipar.teach.exercises.core import number, yours
from minipar.teach.exercises.solution import SolutionFailed, passed_line
from minipar.plan.config import ModelConfig
from minipar.plan.flops import param_count
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)

LLAMA = ModelConfig.preset("llama3-405b")


# ------------------------------------------------------------ right implementations,
# written from the chapters' formulas (not by calling the code the checks compare with)
def allreduce(t):
    n = dist.get_world_size()
    shard = torch.empty(t.numel() // n)
    dist.reduce_scatter_single(shard, t)
    out = torch.empty_like(t)
    dist.all_gather_single(out, shard)
    return out


def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def column_parallel(x, w_shard):
    y = x @ w_shard.T
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, y)
    return torch.cat(parts, dim=-1)


def zigzag(seq_len, rank, cp):
    c = seq_len // (2 * cp)
    return [*range(rank * c, (rank + 1) * c), *range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]


def dp_group(rank, tp, cp, pp, dp):
    inner = tp * cp * pp
    return [rank % inner + d * inner for d in range(dp)]


def waste(interval, write, mtbf, restart):
    return write / interval + ((interval + write) / 2 + restart) / mtbf


NUMERIC = [  # (check, args, right answer, a wrong answer)
    (E.check_young_daly_interval, (60.0, 3600.0), math.sqrt(2 * 60 * 3600), 60.0),
]


@pytest.mark.parametrize("check,args,right,wrong", NUMERIC, ids=lambda v: getattr(v, "__name__", ""))
def test_numeric_checks(check, args, right, wrong):
    judged(check, right, wrong, args=args)


PURE = [  # (check, right function, wrong function)
    (E.check_interleaved_bubble, lambda p, m, v: (p - 1) / (v * m + p - 1), lambda p, m, v: (p - 1) / (m + p - 1)),
    (E.check_zigzag, zigzag, lambda s, r, cp: list(range(r * s // cp, (r + 1) * s // cp))),
    (E.check_dp_group, dp_group, lambda r, tp, cp, pp, dp: list(range(r, r + dp))),
    (E.check_expected_waste, waste, lambda i, w, m, r: w / i + i / m),
]


@pytest.mark.parametrize("check,right,wrong", PURE, ids=lambda v: getattr(v, "__name__", ""))
def test_function_checks(check, right, wrong):
    # a raising attempt is reported, not raised
    judged(check, right, wrong, Wrong(lambda *a: 1 / 0, "ZeroDivisionError"))


def test_multiprocess_checks():
    judged(E.check_allreduce, allreduce, lambda t: t,
           Wrong(lambda t: (dist.all_reduce(t), t)[1], "not allowed"))
    judged(E.check_average_gradients, average_gradients, lambda m: None)
    judged(E.check_column_parallel, column_parallel, lambda x, w: x @ w.T)


def _dies_once(flag, fn):
    """A worker whose rank 1 exits without raising the first time (a stalled or killed
    process, not the reader's code), and calls `fn` once restarted."""
    import os
    if dist.get_rank() == 1 and not os.path.exists(flag):
        open(flag, "w").close()
        os._exit(1)
    return fn()


def test_on_ranks_restarts_a_rank_that_died_once_but_reports_raising_code(tmp_path):
    from functools import partial
    from minipar.teach.exercises.core import on_ranks
    flag = str(tmp_path / "died")
    v = on_ranks(2, partial(_dies_once, flag), lambda: None, "fine", timeout_s=20)
    assert v.ok is True and (tmp_path / "died").exists()          # restarted, then right
    v = on_ranks(2, partial(_dies_once, flag), lambda: 1 / 0, "fine", timeout_s=20)
    assert v.ok is False and "raised" in v.message and "ZeroDivisionError" in v.message


# ------------------------------------------------------------ checks behave as a course
# The verdicts of `number`, on a quantity in GB (the model state per GPU of Table 4's row 1,
# 57.07 GB): every check that reads a number reads it so.
MODEL_STATE_GB = param_count(LLAMA) * 18 / (8 * 16) / 1e9


def state(answer):
    return number(answer, MODEL_STATE_GB, "the model state per GPU", rel=5e-3, unit="GB")


def test_a_verdict_states_its_tolerance():
    near_miss = state(57.37)                                    # 0.52% high, 0.5% allowed
    assert near_miss.ok is False and "0.52% too high" in near_miss.message
    assert "within 0.5%" in near_miss.message
    assert "within 0.5%" in state(57.2).message and state(57.2).ok is True   # 0.22%: right
    assert "Within 0.5% is right" in state(None).message
    exact = number(2 * 7 * 2**30 // 8 + 5000, 2 * 7 * 2**30 // 8, "the bytes sent per rank",
                   rel=1e-6, unit="B")
    assert exact.ok is False and "one part in 1,000,000" in exact.message and "by 5,000 B" in exact.message


@pytest.mark.parametrize("answer", [f"{MODEL_STATE_GB:.2f} GB", f"{MODEL_STATE_GB:.2f}GB",
                                    f"{MODEL_STATE_GB * 1e9 / 2**30:.3f} GiB",
                                    f"{MODEL_STATE_GB * 1e3:,.0f} MB", f"{MODEL_STATE_GB:.2f}"])
def test_a_number_may_carry_its_unit(answer):
    assert state(answer), state(answer).message


def test_a_unit_of_another_kind_is_refused_naming_the_one_wanted():
    too_big = state("3.2 TB")                                   # read as 3,200 GB: far off
    assert too_big.ok is False and "3,200 GB" in too_big.message and "factor" in too_big.message
    for answer in ("12 ms", "50 parsecs", "fifty", "50,7"):
        verdict = state(answer)
        assert verdict.ok is False and ("GB" in verdict.message or "point" in verdict.message), verdict
    assert E.check_young_daly_interval(60.0, 3600.0, f"{math.sqrt(2 * 60 * 3600) / 60:.3f} min")
    assert E.check_young_daly_interval(60.0, 3600.0, f"{math.sqrt(2 * 60 * 3600) * 1e3:.0f} ms")
    assert "seconds" in E.check_young_daly_interval(60.0, 3600.0, "1 GB").message


def test_a_verdict_prints_as_one_line():
    for verdict in (state(None), state(57.37), E.check_will_it_fit(dict(tp=2, pp=2)),
                    E.check_predict_in_flight(None)):
        assert str(verdict) == repr(verdict) == verdict.message and "\n" not in str(verdict)


def test_no_number_check_is_left():
    """Every number a check grades comes from a run, a simulation, a count of the real
    model, or a critique of a design: the plug-in "number" kind is gone."""
    assert not [name for name, (_, kind) in E.REGISTRY.items() if kind == "number"]


def test_a_prediction_sees_the_run_only_after_a_reasonable_attempt(fresh_attempts):
    run = 1_234_567                                   # what "minipar measured"
    check = E.check_predict_step_bytes
    first = check(100, measured=run)                  # a wild first guess: the side, no number
    assert first.ok is False and "below" in first.message and "1,234,567" not in first.message
    assert "1,234,567" not in check(100, measured=run).message     # the same cell run again
    second = check(200, measured=run)                 # a second, different try: the run
    assert second.ok is False and "run / prediction = 1,234,567 B / 200 B" in second.message


def test_a_prediction_within_a_factor_of_two_or_asked_sees_the_run(fresh_attempts):
    run = 1_234_567
    near = E.check_predict_zero_bytes(run // 2 + 1, measured=run)
    assert near.ok is False and "1,234,567" in near.message
    asked = E.check_predict_stage_params(1, measured=run, reveal=True)
    assert asked.ok is False and "run / prediction = 1,234,567 B / 1 B" in asked.message
    shown = E.check_predict_step_bytes(None, measured=run, reveal=True)
    assert shown.ok is None and "1,234,567" in shown.message
    assert E.check_predict_step_bytes(None).ok is None         # nothing runs, nothing shown


# ------------------------------------------------------------ worked solutions, %%solution
NOTEBOOKS = sorted(Path(__file__).parent.parent.glob("notebooks/*.ipynb"))


class Shell:
    """What `load_ipython_extension` needs of IPython's shell: a namespace, the cell
    transform and magic registration."""

    def __init__(self, user_ns):
        self.user_ns, self.magics = user_ns, {}

    def transform_cell(self, cell):
        return cell

    def register_magic_function(self, func, magic_kind, magic_name):
        self.magics[magic_kind, magic_name] = func


def solution_magic(user_ns):
    shell = Shell(user_ns)
    E.load_ipython_extension(shell)
    return shell.magics["cell", "solution"]


RIGHT_SOLUTION = """# Solution: DP is the outermost axis, so its members are tp*cp*pp apart
def dp_group(rank, tp, cp, pp, dp):
    return [rank % (tp * cp * pp) + d * tp * cp * pp for d in range(dp)]
prediction = 42
print("the stride is tp*cp*pp")
check_dp_group(dp_group)"""


@pytest.mark.parametrize("last", ["check_dp_group(dp_group)", "assert check_dp_group(dp_group)"])
def test_a_right_solution_prints_one_line_and_leaves_the_readers_answers(capsys, last):
    mine = lambda *a: [0]                                          # noqa: E731 - the reader's
    user_ns = {"check_dp_group": E.check_dp_group, "dp_group": mine, "prediction": None}
    solution_magic(user_ns)("", RIGHT_SOLUTION.replace("check_dp_group(dp_group)", last))
    assert capsys.readouterr().out == passed_line("check_dp_group") + "\n"
    assert "stride" not in passed_line("check_dp_group") and "Correct" not in passed_line("check_dp_group")
    assert user_ns == {"check_dp_group": E.check_dp_group, "dp_group": mine, "prediction": None}


@pytest.mark.parametrize("body,says", [
    ("def dp_group(rank, tp, cp, pp, dp):\n    return [rank]\nprint('tried')\ncheck_dp_group(dp_group)",
     "your dp_group(0, 2, 1, 1, 2) returned [0]"),
    ("print('tried')\n1 / 0\ncheck_dp_group(dp_group)", "ZeroDivisionError"),
    ("print('tried')\ncheck_dp_group(None)", "Not answered yet"),
    ("print('tried')\n42", "not a check's Verdict"),
])
def test_a_failing_solution_raises_with_what_it_printed(capsys, body, says):
    with pytest.raises(SolutionFailed) as failed:
        solution_magic({"check_dp_group": E.check_dp_group})("", body)
    assert says in str(failed.value) and "tried" in str(failed.value)
    assert capsys.readouterr().out == ""


def test_importing_the_exercises_outside_ipython_imports_no_ipython():
    import subprocess
    import sys
    code = "import sys, minipar.teach.exercises; assert 'IPython' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_solution_cell_starts_with_the_magic_alone(path):
    cells = [c for c in json.loads(path.read_text())["cells"]
             if "solution" in c["metadata"].get("tags", [])]
    assert cells, f"{path.name} has no solution cell"
    for cell in cells:
        assert "".join(cell["source"]).split("\n")[0] == "%%solution", cell["source"][:2]


def test_a_verdict_names_the_readers_function():
    assert yours(dp_group) == "your dp_group"
    assert yours(lambda *a: 0) == yours(functools.partial(dp_group, 0)) == "your function"

    def bad_dp_group(rank, tp, cp, pp, dp):
        return [rank]
    assert "your bad_dp_group(0, 2, 1, 1, 2) returned [0]" in E.check_dp_group(bad_dp_group).message
    assert "your function(2, 4, 2) returned" in E.check_interleaved_bubble(lambda p, m, v: 0.5).message
    wrong = lambda i, w, m, r: 0.5                                 # noqa: E731
    assert "your function(" in E.check_expected_waste(wrong).message


def test_no_verdict_speaks_of_fn():
    """A verdict names the reader's function (`core.yours`), never a placeholder `fn`."""
    folder = Path(E.__file__).parent
    for source in folder.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.JoinedStr):
                text = ast.unparse(node)
                assert not re.search(r"\bfn[({]", text), f"{source.name}: {text}"
