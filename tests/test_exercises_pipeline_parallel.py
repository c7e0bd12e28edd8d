"""The pipeline chapter's checks: a right answer passes, the typical wrong ones fail with a
message that says what the simulator saw, and no answer is "not answered yet"."""
from __future__ import annotations

from minipar.parallel.schedules import make_schedule
from minipar.teach.exercises import pipeline_parallel as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def test_bubble():
    judged(ex.check_bubble, 3 / 11, Wrong(3 / 8, "idle over busy"), args=(4, 8))
    assert ex.check_bubble(4, 8, "27.27%")                    # a percentage is read as one


def test_interleaved_bubble():
    judged(ex.check_interleaved_bubble, lambda p, m, v: (p - 1) / (v * m + p - 1),
           lambda p, m, v: (p - 1) / (m + p - 1))


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
    judged(ex.check_one_f_one_b, _one_f_one_b,
           Wrong(lambda p, m: make_schedule("afab", p, m), "in flight"),
           Wrong(lambda p, m: [[a for i in range(m) for a in (("F", i), ("B", i))] for _ in range(p)],
                 "step takes"),
           Wrong(lambda p, m: [acts[:-1] for acts in _one_f_one_b(p, m)], "missing"))


def test_predict_bubble_runs_minipar_and_reports_the_ratio(fresh_attempts):
    good = ex.check_predict_bubble(1 / 5)
    assert good and "run's bubble / prediction" in good.message
    far = ex.check_predict_bubble(0.9)                      # a first wild guess: not the run
    assert far.ok is False and "factor of 2 above the chapter's model" in far.message
    assert "run's bubble" not in far.message
    judged(ex.check_predict_bubble, 1 / 5, Wrong(1 / 4, "run's bubble"))   # near: the run shown
    assert "run's bubble" in ex.check_predict_bubble(None, reveal=True).message


def test_the_reader_schedule_is_what_the_ranks_run(tmp_path):
    """`executing` really swaps the executor's plan: under --schedule 1f1b the ranks run
    AFAB's order when told to (all forwards of rank 0 before its first backward)."""
    from minipar.config import ParallelConfig
    from minipar import profile
    from minipar.config import TrainConfig
    from minipar.parallel.schedule_analysis import pipeline_events
    from minipar.train import train
    with ex.executing(make_schedule("afab", 2, 4)):
        train(TrainConfig(parallel=ParallelConfig(pp=2, schedule="1f1b", microbatches=4),
                          global_batch=4, seq_len=32, steps=1, progress=False, profile=str(tmp_path)))
    done = pipeline_events(profile.load(tmp_path))
    kinds = [e["kind"] for e in sorted(done, key=lambda e: e["start"]) if e["rank"] == 0]
    assert kinds == ["F"] * 4 + ["B"] * 4
