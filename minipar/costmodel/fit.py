"""`python -m minipar.costmodel.fit`: fit the cost model's constants on published runs.

Chapter "Four dimensions at once". The constants of `Efficiency` (`FITTED`: at most five)
are chosen to minimise the error, in MFU points, of the model's prediction of every run in
`data/published_runs.csv`, and only those runs: other published tables are kept back to
test what the model predicts without having seen them. The loss is Huber's with a 3-point
knee: a row within 3 points counts its squared error, a row further out only linearly, so
that one run the physics cannot explain does not drag every other row away. The search is
Nelder and Mead's simplex (deterministic, from the defaults of `Efficiency`), inside bounds
that keep each constant physical. Writes `data/constants.json` (`--write`), which the
package loads, and prints every row's residual, then each row's leave-one-out residual
(fitted on the other fourteen), then the held-out cells of the Playbook's heatmap
(`data/playbook_heatmap.csv` minus the calibration rows): runs of the same code the fit
never reads, predicted, with how often two of them are ranked in the published order.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from .calibration import RUNS_FILE, PublishedRun, held_out_runs, playbook_runs, published_runs
from .constants import BF16_MIXED, CONSTANTS_FILE, FITTED, Efficiency
from .time import _estimate

BOUNDS = {"dense": (0.3, 1.0), "attention": (0.1, 1.0), "network": (0.2, 1.0),
          "network_inter": (0.05, 1.0)}
KNEE = 3.0          # MFU points: Huber's knee


def estimate_run(run: PublishedRun, eff: Efficiency):
    """The model's `Estimate` of one published run, with the constants `eff`."""
    return _estimate(run.model, run.parallel, run.cluster, run.work, BF16_MIXED, eff)


def predict(run: PublishedRun, eff: Efficiency) -> float:
    """The model's MFU for one published run."""
    return estimate_run(run, eff).mfu


def residuals(runs: list[PublishedRun], eff: Efficiency) -> list[float]:
    """Predicted minus published MFU, in points, row by row."""
    return [100 * (predict(r, eff) - r.mfu) for r in runs]


def huber(r: float, knee: float = KNEE) -> float:
    return 0.5 * r * r if abs(r) <= knee else knee * (abs(r) - 0.5 * knee)


def _efficiency(x: list[float]) -> Efficiency:
    clipped = {k: min(max(v, BOUNDS[k][0]), BOUNDS[k][1]) for k, v in zip(FITTED, x)}
    return replace(Efficiency(), **clipped)


def loss(x: list[float], runs: list[PublishedRun]) -> float:
    return sum(huber(r) for r in residuals(runs, _efficiency(x)))


def nelder_mead(f, x0: list[float], step: float = 0.05, iters: int = 400) -> list[float]:
    """Minimise f from x0 by the simplex method (reflect, expand, contract, shrink)."""
    pts = [list(x0)] + [[v + (step if i == j else 0.0) for j, v in enumerate(x0)]
                        for i in range(len(x0))]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(len(pts)), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centre = [sum(p[j] for p in pts[:-1]) / (len(pts) - 1) for j in range(len(x0))]

        def toward(t):
            return [c + t * (w - c) for c, w in zip(centre, pts[-1])]
        refl = toward(-1.0)
        fr = f(refl)
        if fr < vals[0]:
            exp = toward(-2.0)
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = toward(0.5)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [[a + 0.5 * (b - a) for a, b in zip(pts[0], p)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[min(range(len(pts)), key=vals.__getitem__)]


def fit(runs: list[PublishedRun] | None = None) -> Efficiency:
    """The constants that minimise the Huber loss over `runs` (default: the calibration file)."""
    runs = published_runs() if runs is None else runs
    start = Efficiency()
    x = nelder_mead(lambda x: loss(x, runs), [getattr(start, k) for k in FITTED])
    eff = _efficiency(x)
    return replace(eff, **{k: round(getattr(eff, k), 4) for k in FITTED})


def report(runs: list[PublishedRun], eff: Efficiency) -> str:
    """One line per row: the MFU as published, in minipar's FLOP count (what is compared),
    predicted, residual; then the summary."""
    res = residuals(runs, eff)
    lines = [f"{'run':52s} {'published':>9s} {'counted':>7s} {'predicted':>9s} {'residual':>8s}"]
    for run, r in zip(runs, res):
        lines.append(f"{run.source[:10]} {run.label:41s} {100 * run.printed_mfu:9.1f} "
                     f"{100 * run.mfu:7.1f} {100 * run.mfu + r:9.1f} {r:+8.1f}")
    inside = sum(abs(r) <= KNEE for r in res)
    lines.append(f"{inside} of {len(res)} rows within {KNEE:g} points; mean |residual| "
                 f"{sum(map(abs, res)) / len(res):.1f}, worst {max(map(abs, res)):.1f}")
    return "\n".join(lines)


def leave_one_out(runs: list[PublishedRun]) -> list[float]:
    """Cross-validation: for each row, fit on the other rows and predict it. The residual
    of a row the constants never saw is the proxy for how the model does on runs it was
    not fitted on (the held-back tables)."""
    return [residuals([run], fit(runs[:i] + runs[i + 1:]))[0] for i, run in enumerate(runs)]


def loo_report(runs: list[PublishedRun], held: list[float]) -> str:
    lines = ["leave-one-out (fit on the other rows, predict this one):"]
    lines += [f"  {run.label:52s} {r:+6.1f}" for run, r in zip(runs, held)]
    lines.append(f"leave-one-out mean |residual| {sum(map(abs, held)) / len(held):.1f}, "
                 f"worst {max(map(abs, held)):.1f}")
    return "\n".join(lines)


def pairs_in_order(published: list[float], predicted: list[float]) -> float:
    """Fraction of the pairs of runs that the prediction ranks as the publication does
    (ties in either count as agreement): does the model order layouts right?"""
    pairs = [(i, j) for i in range(len(published)) for j in range(i + 1, len(published))]
    agree = sum((published[i] - published[j]) * (predicted[i] - predicted[j]) >= 0
                for i, j in pairs)
    return agree / len(pairs)


def order_kept(runs: list[PublishedRun], res: list[float]) -> float:
    """`pairs_in_order` of the runs' published MFU and the prediction (published + residual)."""
    return pairs_in_order([r.mfu for r in runs], [r.mfu + d / 100 for r, d in zip(runs, res)])


def held_out_report(runs: list[PublishedRun], eff: Efficiency) -> str:
    """The held-out cells: published, predicted, error; the mean and worst error, and the
    share of pairs in the published order."""
    res = residuals(runs, eff)
    lines = ["held out (the heatmap's other cells; never fitted on; MFU in minipar's count):"]
    lines += [f"  {run.label:52s} {100 * run.mfu:5.1f} {100 * run.mfu + r:5.1f} {r:+6.1f}"
              for run, r in zip(runs, res)]
    order = order_kept(runs, res)
    lines.append(f"held out: mean |error| {sum(map(abs, res)) / len(res):.1f}, worst "
                 f"{max(map(abs, res)):.1f}; {100 * order:.0f}% of pairs in the published order")
    return "\n".join(lines)


def layout_order(runs: list[PublishedRun], eff: Efficiency) -> dict:
    """Rank the layouts tried for each model on each cluster size, as a user choosing among
    them would: the share of pairs (within a group) in the published order, how many groups'
    first pick is the published best, and how many pick one that ran below half the best."""
    groups: dict[tuple, list] = {}
    for run, mfu in zip(runs, (predict(r, eff) for r in runs)):
        groups.setdefault((run.model.name, run.parallel.world_size), []).append((run.mfu, mfu))
    groups = {k: g for k, g in groups.items() if len(g) >= 3}
    pairs = agree = best = below_half = 0
    for g in groups.values():
        n = len(g) * (len(g) - 1) // 2
        pairs, agree = pairs + n, agree + n * pairs_in_order([a for a, _ in g], [b for _, b in g])
        pick = max(g, key=lambda t: t[1])[0]
        top = max(a for a, _ in g)
        best, below_half = best + (pick == top), below_half + (pick < top / 2)
    return {"runs": sum(map(len, groups.values())), "groups": len(groups),
            "pairs_in_order": agree / pairs, "first_pick_best": best, "first_pick_below_half": below_half}


def layout_order_report(order: dict) -> str:
    return (f"each model's layouts on each cluster size ({order['runs']} runs of the Playbook's "
            f"figure, {order['groups']} groups): {100 * order['pairs_in_order']:.0f}% of pairs in the "
            f"published order; the first pick is the published best in {order['first_pick_best']} "
            f"groups, below half of it in {order['first_pick_below_half']}")


def write(eff: Efficiency, path: Path = CONSTANTS_FILE,
          held: list[float] | None = None) -> None:
    """The constants, and (for the book) each row's residual and leave-one-out residual."""
    runs = published_runs()
    data = {"fitted_on": str(RUNS_FILE.name), "by": "python -m minipar.costmodel.fit --write",
            "loss": f"Huber, knee {KNEE:g} MFU points", "constants": {k: asdict(eff)[k] for k in FITTED},
            "residuals": {run.label: round(r, 2) for run, r in zip(runs, residuals(runs, eff))}}
    if held is not None:
        data["leave_one_out"] = {run.label: round(r, 2) for run, r in zip(runs, held)}
    out = held_out_runs()
    data["held_out"] = {run.label: round(r, 2) for run, r in zip(out, residuals(out, eff))}
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minipar.costmodel.fit", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write the constants to {CONSTANTS_FILE.name}")
    p.add_argument("--no-loo", action="store_true", help="skip the leave-one-out cross-validation")
    args = p.parse_args(argv)
    runs = published_runs()
    eff = fit(runs)
    print("fitted:", ", ".join(f"{k}={getattr(eff, k)}" for k in FITTED))
    print(report(runs, eff))
    held = None if args.no_loo else leave_one_out(runs)
    if held is not None:
        print(loo_report(runs, held))
    print(held_out_report(held_out_runs(), eff))
    print(layout_order_report(layout_order(playbook_runs(), eff)))
    if args.write:
        write(eff, held=held)
        print(f"wrote {CONSTANTS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
