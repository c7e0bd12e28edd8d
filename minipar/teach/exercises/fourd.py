"""The exercises of the four dimensions at once chapter, checked (see core.py for how)."""
from __future__ import annotations

from ...grid import ProcessGrid
from .core import NOT_ANSWERED, Verdict, exercise, function_given, number, right, wrong


@exercise("fourd", "number")
def check_coords(rank: int, tp: int, cp: int, pp: int, dp: int, answer) -> Verdict:
    """answer: {"tp": .., "cp": .., "pp": .., "dp": ..} of `rank` in the [TP, CP, PP, DP] order."""
    if answer is None:
        return Verdict(None, NOT_ANSWERED)
    want = ProcessGrid(tp, cp, pp, dp).coords(rank)
    try:
        got = {a: int(answer[a]) for a in want}
    except (TypeError, KeyError, ValueError):
        return wrong("answer with a dict with keys 'tp', 'cp', 'pp', 'dp'.")
    if got == want:
        return right(f"(the coordinates of rank {rank})")
    off = [a for a in want if got[a] != want[a]]
    return wrong(f"the {', '.join(off)} coordinate{'s are' if len(off) > 1 else ' is'} off; "
                  f"TP varies fastest, then CP, PP, DP.")


@exercise("fourd", "implement")
def check_dp_group(fn) -> Verdict:
    """fn(rank, tp, cp, pp, dp) -> the global ranks of `rank`'s DP group, sorted."""
    problem = function_given(fn)
    if problem is not None:
        return problem
    for sizes in [(2, 1, 1, 2), (2, 2, 2, 2), (8, 1, 4, 3)]:
        grid = ProcessGrid(*sizes)
        for rank in range(0, grid.world_size, 5):
            want = list(grid.group_ranks("dp", rank))
            try:
                got = sorted(int(r) for r in fn(rank, *sizes))
            except Exception as e:   # noqa: BLE001
                return wrong(f"fn({rank}, {', '.join(map(str, sizes))}) raised "
                              f"{type(e).__name__}: {e}")
            if got != want:
                return wrong(f"fn({rank}, {', '.join(map(str, sizes))}) = {got}: a DP group "
                              f"holds {sizes[3]} ranks that differ only in their dp coordinate.")
    return right("your DP groups match ProcessGrid's.")


__all__ = [n for n in dir() if n.startswith("check_")]
