"""The failures chapter's checks accept the right answer and reject the usual wrong ones."""
from __future__ import annotations

import math

from minipar.formulas.failures import expected_waste
from minipar.teach.exercises import failures as ex


def correct_commit(fs, root, step):
    fs.write(f"{root}/{step}.tmp/manifest.json", "{}")
    fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
    fs.write(f"{root}/latest.tmp", step)
    fs.replace(f"{root}/latest.tmp", f"{root}/latest")


def test_young_daly_interval():
    m = 54 * 86400 / 419
    assert ex.check_young_daly_interval(60, m, math.sqrt(2 * 60 * m))
    assert ex.check_young_daly_interval(60, m, math.sqrt(60 * m)).ok is False
    assert ex.check_young_daly_interval(60, m, None).ok is None


def test_expected_waste():
    assert ex.check_expected_waste(expected_waste)
    assert ex.check_expected_waste(lambda t, d, m, r: d / t + (t / 2 + r) / m).ok is False
    assert ex.check_expected_waste(None).ok is None


def test_commit_accepts_the_protocol_and_rejects_each_bug():
    assert ex.check_commit(correct_commit)

    def manifest_after_rename(fs, root, step):
        fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
        fs.write(f"{root}/{step}/manifest.json", "{}")
        fs.write(f"{root}/latest.tmp", step)
        fs.replace(f"{root}/latest.tmp", f"{root}/latest")

    def latest_in_place(fs, root, step):
        fs.write(f"{root}/{step}.tmp/manifest.json", "{}")
        fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")
        fs.write(f"{root}/latest", step)

    def latest_first(fs, root, step):
        fs.write(f"{root}/latest.tmp", step)
        fs.replace(f"{root}/latest.tmp", f"{root}/latest")
        fs.write(f"{root}/{step}.tmp/manifest.json", "{}")
        fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")

    def forgets_latest(fs, root, step):
        fs.write(f"{root}/{step}.tmp/manifest.json", "{}")
        fs.rename(f"{root}/{step}.tmp", f"{root}/{step}")

    for bug, says in ((manifest_after_rename, "no manifest"), (latest_in_place, "not a complete"),
                      (latest_first, "not a complete"), (forgets_latest, "latest names")):
        verdict = ex.check_commit(bug)
        assert verdict.ok is False and says in verdict.message, (bug.__name__, verdict.message)
    assert ex.check_commit(None).ok is None


def test_steps_computed_runs_the_failure():
    # save after 4 and 8 steps; rank 1 dies at the start of step 7: steps 4-6 redone
    verdict = ex.check_steps_computed(13, steps=10, save_every=4, fail_at_step=7)
    assert verdict, verdict.message
    assert "13 / 13" in verdict.message
    assert ex.check_steps_computed(10, steps=10, save_every=4, fail_at_step=7).ok is False
    assert ex.check_steps_computed(None).ok is None


def test_resharding_figure_owners_partition_the_tensor():
    from minipar.teach.figures.failures import owners
    saved = owners((6, 5), 0, 2, 2, True)
    # TP rank 0 holds rows 0-2 (15 elements): ZeRO gives dp rank 0 the first 8, rank 1 (global 2) 7
    assert saved.view(-1)[:15].tolist() == [0] * 8 + [2] * 7
    assert sorted(saved.view(-1).bincount().tolist()) == [7, 7, 8, 8]
    assert owners((6, 5), 1, 5, 1, False)[0].tolist() == [0, 1, 2, 3, 4]
