"""The pipeline chapter's checks: a right answer passes, the typical wrong ones fail with a
message that says what the simulator saw, and no answer is "not answered yet"."""
from __future__ import annotations

from minipar.parallel.schedules import make_schedule
from minipar.teach.exercises import pipeline_parallel as ex


def test_bubble():
    assert ex.check_bubble(4, 8, 3 / 11)
    assert ex.check_bubble(4, 8, 3 / 8).ok is False
    assert ex.check_bubble(4, 8, None).ok is None


def test_interleaved_bubble():
    assert ex.check_interleaved_bubble(lambda p, m, v: (p - 1) / (v * m + p - 1))
    assert ex.check_interleaved_bubble(lambda p, m, v: (p - 1) / (m + p - 1)).ok is False


def _one_f_one_b(p, m):
    out = []
    for r in range(p):
        w = min(p - 1 - r, m)
        acts = [("F", i) for i in range(w)]
        for i in range(m - w):
            acts += [("F", w + i), ("B", i)]
        out.append(acts + [("B", i) for i in range(m - w, m)])
    return out


def test_one_f_one_b_schedule():
    assert ex.check_one_f_one_b(_one_f_one_b)
    afab = ex.check_one_f_one_b(lambda p, m: make_schedule("afab", p, m))
    assert afab.ok is False and "in flight" in afab.message
    no_warmup = ex.check_one_f_one_b(
        lambda p, m: [[a for i in range(m) for a in (("F", i), ("B", i))] for _ in range(p)])
    assert no_warmup.ok is False and "step takes" in no_warmup.message
    missing = ex.check_one_f_one_b(lambda p, m: [acts[:-1] for acts in _one_f_one_b(p, m)])
    assert missing.ok is False and "missing" in missing.message
    assert ex.check_one_f_one_b(None).ok is None


def test_predict_bubble_runs_minipar_and_reports_the_ratio():
    good = ex.check_predict_bubble(1 / 5)
    assert good and "Run / prediction" in good.message
    assert ex.check_predict_bubble(1 / 4).ok is False
    assert ex.check_predict_bubble(None).ok is None


def test_the_reader_schedule_is_what_the_ranks_run(tmp_path):
    """`executing` really swaps the executor's plan: under --schedule 1f1b the ranks run
    AFAB's order when told to (all forwards of rank 0 before its first backward)."""
    from minipar.config import ParallelConfig
    from minipar.parallel.pipeline import load_trace
    from minipar.train import TrainConfig, train
    path = tmp_path / "trace.json"
    with ex.executing(make_schedule("afab", 2, 4)):
        train(TrainConfig(parallel=ParallelConfig(pp=2, schedule="1f1b", microbatches=4),
                          global_batch=4, seq_len=32, steps=1, progress=False, trace=str(path)))
    kinds = [e["kind"] for e in sorted(load_trace(path), key=lambda e: e["start"]) if e["rank"] == 0]
    assert kinds == ["F"] * 4 + ["B"] * 4
