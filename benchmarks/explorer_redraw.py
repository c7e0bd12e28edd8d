"""How long each chapter's live explorer takes to redraw when a control moves, as a notebook
sees it: `figure(**values)` and the PNG the inline backend makes of it.

    python benchmarks/explorer_redraw.py [--only CHAPTER ...] [--all-values]

Chapter "The explorers" (minipar.teach.explorers): each control is moved, one at a time from
the explorer's DEFAULTS, to its last value (with --all-values, to every value it has), and
each redraw is timed twice: wall clock and this process's CPU time (on a machine shared with
other work the CPU time is the steadier). The first redraw of a setting is the one a reader
waits for (an explorer may keep what it computed: the second move back is faster); the
slowest of all is printed at the end. The 4D planner's explorer plans the moves one step
away while the reader reads: its moves are timed again after that ("planned ahead"). Issue 42 asks for
every redraw within 2 s on 2 cores. A benchmark, not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# run as a script from the repository root or anywhere: find the package next to us
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minipar.teach import web  # noqa: E402
from minipar.teach.widgets import offered  # noqa: E402


def redraw(chapter: str, values: dict) -> tuple[float, float]:
    """(wall s, CPU s) of one redraw: the figure, then its PNG (what the notebook shows)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fig = web.explorer(chapter).figure(**values)
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)
    return time.perf_counter() - wall, time.process_time() - cpu


def moves(chapter: str, all_values: bool):
    """(control, value, values) for each move: every control to its last value (or to each)."""
    defaults = web.explorer(chapter).DEFAULTS
    for name, control in web.controls(chapter).items():
        values = offered(control)
        for value in (values if all_values else values[-1:]):
            if value != defaults.get(name):
                yield name, value, {**defaults, name: value}


def warmed(chapter: str) -> None:
    """An explorer that plans ahead (`PLANS`, the 4D planner's): each move again, after its
    background thread planned the moves one step away, as it does while a reader reads."""
    module = web.explorer(chapter)
    if not hasattr(module, "PLANS"):
        return
    for key in module.neighbours(module.DEFAULTS):
        module.PLANS.get(key)
    for name, value, values in moves(chapter, False):
        wall, cpu = redraw(chapter, values)
        print(f"{chapter:18s} {name:16s} {str(value):>10s} {wall:7.2f} {cpu:6.2f}  (planned ahead)",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=web.CHAPTERS, default=list(web.CHAPTERS))
    ap.add_argument("--all-values", action="store_true")
    args = ap.parse_args(argv)
    worst = (0.0, 0.0, "")
    print(f"{'explorer':18s} {'control':16s} {'value':>10s} {'wall s':>7s} {'CPU s':>6s}")
    for chapter in args.only:
        wall, cpu = redraw(chapter, web.explorer(chapter).DEFAULTS)
        print(f"{chapter:18s} {'(defaults)':16s} {'':>10s} {wall:7.2f} {cpu:6.2f}", flush=True)
        for name, value, values in moves(chapter, args.all_values):
            wall, cpu = redraw(chapter, values)
            print(f"{chapter:18s} {name:16s} {str(value):>10s} {wall:7.2f} {cpu:6.2f}", flush=True)
            worst = max(worst, (wall, cpu, f"{chapter} {name}={value}"))
        warmed(chapter)
    print(f"slowest redraw: {worst[2]}: {worst[0]:.2f} s wall, {worst[1]:.2f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
