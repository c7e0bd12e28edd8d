"""The failures chapter's checks accept the right answer and reject the usual wrong ones."""
from __future__ import annotations

import math

from minipar.plan.formulas.failures import expected_waste, young_interval
from minipar.teach.exercises import failures as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def commit_in_order(*moves):
    """A commit made of these moves, in this order: "manifest" (written into .tmp, or into
    the renamed directory if it comes after "rename"), "rename" (.tmp to its name), "latest"
    (through a temporary file and an atomic replace) or "latest in place" (written over)."""
    def commit(fs, root, step):
        renamed = False
        for move in moves:
            if move == "manifest":
                fs.write(f"{root}/{step}{'' if renamed else '.tmp'}/manifest.json", "{}")
            elif move == "rename":
                fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
                renamed = True
            elif move == "latest":
                fs.write(f"{root}/latest.tmp", step)
                fs.replace(f"{root}/latest.tmp", f"{root}/latest")
            else:
                fs.write(f"{root}/latest", step)
    return commit


def test_simulated_failures_agree_with_the_first_order_model_where_it_holds():
    for case in ex.WASTE_CASES:
        assert math.isclose(ex.simulated_waste(*case), expected_waste(*case), rel_tol=ex.WASTE_REL)
    # and not where failures are frequent next to the interval: the simulation is no formula
    assert not math.isclose(ex.simulated_waste(300, 20, 7200, 900), expected_waste(300, 20, 7200, 900),
                            rel_tol=ex.WASTE_REL)
    best, least = ex.simulated_best(60, 54 * 86400 / 419)
    assert math.isclose(best, young_interval(60, 54 * 86400 / 419), rel_tol=0.2)


def test_young_daly_interval(fresh_attempts):
    m = 54 * 86400 / 419
    judged(ex.check_young_daly_interval, math.sqrt(2 * 60 * m), Wrong(math.sqrt(60 * m), "half an interval"),
           Wrong(math.sqrt(2 * 60 * m) / 60, "not minutes"), Wrong(60, "too short"),
           Wrong(4 * math.sqrt(2 * 60 * m), "too long"), args=(60, m))
    assert ex.check_young_daly_interval(60, m, f"{math.sqrt(2 * 60 * m) / 60:.2f} min")
    assert "about" in ex.check_young_daly_interval(60, m, None, reveal=True).message


def test_expected_waste_bug():
    judged(ex.check_expected_waste, expected_waste, Wrong(ex.buggy_expected_waste, "simulated run"),
           Wrong(lambda t, d, m, r: d / t + (t / 2) / m, "simulated run"))


def test_commit_accepts_the_protocol_and_rejects_each_bug():
    judged(ex.check_commit, commit_in_order("manifest", "rename", "latest"),
           Wrong(commit_in_order("rename", "manifest", "latest"), "no manifest"),
           Wrong(commit_in_order("manifest", "rename", "latest in place"), "not a complete"),
           Wrong(commit_in_order("latest", "manifest", "rename"), "not a complete"),
           Wrong(commit_in_order("manifest", "rename"), "latest names"),
           Wrong(lambda fs, root, step: fs.explode(), "raised"))
    assert "7 moments" in ex.check_commit(commit_in_order("manifest", "rename", "latest")).message


def test_steps_computed_runs_the_failure():
    # save after 4 and 8 steps; rank 1 dies at the start of step 7: steps 4-6 redone
    verdict = ex.check_steps_computed(13, steps=10, save_every=4, fail_at_step=7)
    assert verdict, verdict.message
    assert "13 / 13" in verdict.message and "step 4" in verdict.message
    judged(ex.check_steps_computed, 13, 10, steps=10, save_every=4, fail_at_step=7)


def test_resharding_figure_owners_partition_the_tensor():
    from minipar.teach.figures.failures import owners
    saved = owners((6, 5), 0, 2, 2, True)
    # TP rank 0 holds rows 0-2 (15 elements): ZeRO gives dp rank 0 the first 8, rank 1 (global 2) 7
    assert saved.view(-1)[:15].tolist() == [0] * 8 + [2] * 7
    assert sorted(saved.view(-1).bincount().tolist()) == [7, 7, 8, 8]
    assert owners((6, 5), 1, 5, 1, False)[0].tolist() == [0, 1, 2, 3, 4]
