"""How long each chapter's live explorer takes to draw, and to redraw a setting it never saw,
as a notebook shows it.

    python benchmarks/explorers.py [--only CHAPTER ...] [--all-values]

Chapter "The explorers" (minipar.teach.explorers). What is timed is what the widgets do when
a control moves: the draw function that `explore()` hands to `widgets.explorer`, the SVG the
notebook's inline backend makes of its figure (`print_figure`, `bbox_inches="tight"`), then
the explorer's `shown` (the 4D planner's queues the plans one move away). Every move runs in
a process of its own, forked from one that has imported everything and drawn nothing: it
draws the explorer's DEFAULTS (the "first draw"), then moves one control (the "cold
redraw"), so no move finds a result kept from another. Each control goes to its first and
last value, a dropdown to each (with --all-values, every control to each), the 4D planner's
also to the largest settings. Prefetching is off for these: a cold redraw is one that
nothing planned ahead. The 4D explorer's last two rows time it on: a move that was planned
ahead, and a slider jump two steps away made at once, while a guess is still being planned
(the reader waits for it if it is the guess for that very setting). Wall clock and the process's CPU time (its
threads too; on a machine shared with other work the steadier); the slowest cold redraw is
printed last. Issue 42 asks for every redraw within 2 s on 2 cores. A benchmark, not a
test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from IPython.core.pylabtools import print_figure  # noqa: E402

# run as a script from the repository root or anywhere: find the package next to us
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minipar.teach import web, widgets  # noqa: E402
from minipar.teach.explorers.prefetch import Prefetcher  # noqa: E402
from minipar.teach.widgets import offered  # noqa: E402

EXTRA = {"fourd": {"gpus": [16384], "seq_len": [131072]}}   # the largest settings, named
# The explorers that plan ahead: a move one step away (planned ahead), one two steps away.
AHEAD = {"fourd": (("gpus", 16384), ("gpus", 2048))}


def live_draw(chapter: str):
    """(redraw, start values): what the explorer's widgets do when a control moves, as
    `explore()` hands it to `widgets.explorer` (caught instead of building the widgets):
    draw the figure, show it (the SVG the notebook displays), then `shown`, if any."""
    module, caught = web.explorer(chapter), {}

    def catch(controls, draw, values, split, shown=None):
        caught.update(draw=draw, values=values, shown=shown)
    for owner in (widgets, module):          # the explorers import `explorer` by name
        if hasattr(owner, "explorer"):
            owner.explorer = catch
    module.explore()

    def redraw(**values):
        fig = caught["draw"](**values)
        print_figure(fig, "svg", bbox_inches="tight")
        plt.close(fig)
        if caught["shown"]:
            caught["shown"](**values)
    return redraw, caught["values"]


def timed(redraw, values: dict) -> tuple[float, float]:
    """(wall ms, CPU ms) of one redraw."""
    wall, cpu = time.perf_counter(), time.process_time()
    redraw(**values)
    return 1e3 * (time.perf_counter() - wall), 1e3 * (time.process_time() - cpu)


def moves(chapter: str, all_values: bool):
    """(control, value) of each move away from the defaults: first and last value of every
    control (or each value), and the chapter's EXTRA."""
    defaults = web.explorer(chapter).DEFAULTS
    for name, control in web.controls(chapter).items():
        values = offered(control)
        ends = values if all_values or control.kind == "choice" else (values[0], values[-1])
        picked = tuple(ends)
        picked += tuple(EXTRA.get(chapter, {}).get(name, ()))
        for value in dict.fromkeys(picked):
            if value != defaults.get(name):
                yield name, value


def cold(chapter: str, name: str, value) -> dict:
    """In a fresh process: the first draw, then the move to `name` = `value`, nothing prefetched."""
    Prefetcher.warm = lambda self, keys: None          # no guesses: every move is cold
    redraw, values = live_draw(chapter)
    first = timed(redraw, values)
    return {"first": first, "move": timed(redraw, {**values, name: value})}


def prefetched(chapter: str, name: str, value, wait: bool) -> dict:
    """In a fresh process, prefetching on: the first draw, then the move, after the guesses
    were all planned (`wait`) or at once (the reader waits for the guess being planned)."""
    redraw, values = live_draw(chapter)
    module = web.explorer(chapter)
    redraw(**values)
    if wait:
        for key in module.neighbours(values):
            module.PLANS.get(key)
    return {"move": timed(redraw, {**values, name: value})}


def forked(fn, *args) -> dict:
    """`fn(*args)` in a child forked from this process, which has imported and drawn nothing:
    no cache of the child outlives it."""
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=lambda: there.send(fn(*args)))
    child.start()
    out = here.recv()
    child.join()
    return out


def row(chapter: str, move: str, times: tuple[float, float]) -> None:
    print(f"{chapter:18s} {move:30s} {times[0]:8.0f} {times[1]:8.0f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=web.CHAPTERS, default=list(web.CHAPTERS))
    ap.add_argument("--all-values", action="store_true")
    args = ap.parse_args(argv)
    worst = (0.0, 0.0, "")
    print(f"{'explorer':18s} {'move':30s} {'wall ms':>8s} {'CPU ms':>8s}")
    for chapter in args.only:
        first = None
        for name, value in moves(chapter, args.all_values):
            out = forked(cold, chapter, name, value)
            if first is None:
                first = out["first"]
                row(chapter, "(first draw)", first)
            row(chapter, f"{name} = {value}", out["move"])
            worst = max(worst, (*out["move"], f"{chapter} {name} = {value}"))
        if chapter in AHEAD:
            (near, one), (far, two) = AHEAD[chapter]
            row(chapter, f"{near} = {one} (planned ahead)", forked(prefetched, chapter, near, one, True)["move"])
            row(chapter, f"{far} = {two} (while guessing)", forked(prefetched, chapter, far, two, False)["move"])
    print(f"slowest cold redraw: {worst[2]}: {worst[0]:.0f} ms wall, {worst[1]:.0f} ms CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
