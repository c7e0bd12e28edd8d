"""The pipeline chapter's checks: a right answer passes, the typical wrong ones fail with a
message that says what the simulator saw, and no answer is "not answered yet"."""
from __future__ import annotations

from minipar.plan.schedule_analysis import peak_in_flight
from minipar.plan.schedules import make_schedule
from minipar.teach.exercises import core, pipeline_parallel as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def test_bubble(fresh_attempts):
    right = _afab_with_transfers(4, 8, 0.5)
    assert ex.check_bubble(4, 8, f"{100 * right:.3f}%", schedule="afab")   # a percentage is read as one
    free = ex.check_bubble(4, 8, 3 / 11, t_comm=0)            # free messages: the printed formula
    assert free.ok is False and "t_comm > 0" in free.message


def _afab_with_transfers(p, m, c, t_f=1.0, t_b=2.0):
    """From the chapter's picture: the first micro-batch fills the pipeline across p - 1
    boundaries, the last drains it back across them, each message taking c."""
    idle = (p - 1) * (t_f + t_b + 2 * c)
    return idle / (m * (t_f + t_b) + idle)


def test_bubble_with_transfers_is_the_simulators(fresh_attempts):
    kw = dict(args=(4, 8), schedule="afab", t_comm=0.5)
    judged(ex.check_bubble, _afab_with_transfers(4, 8, 0.5),
           Wrong(3 / 11, "without transfers"),                             # the plug-in answer
           Wrong(_afab_with_transfers(4, 8, 0.25), "both passes"),
           Wrong(9 / 36, "idle too"),                                    # waits left out
           Wrong(0.5, "idle over busy"), **kw)
    right = ex.check_bubble(4, 8, _afab_with_transfers(4, 8, 0.5), schedule="afab", t_comm=0.5)
    assert "1F1B" in right.message                                  # and what 1F1B does there
    core.ATTEMPTS.clear()
    far = ex.check_bubble(4, 8, 0.9, schedule="afab", t_comm=0.5)   # first wild guess: hidden
    assert far.ok is False and "factor of 2 above the simulated AFAB" in far.message
    assert "0.333" not in far.message
    shown = ex.check_bubble(4, 8, None, schedule="afab", t_comm=0.5, reveal=True)
    assert shown.ok is None and "0.333333" in shown.message
    for p, m in ((2, 4), (3, 6), (4, 2)):
        assert ex.check_bubble(p, m, _afab_with_transfers(p, m, 1.0), schedule="afab", t_comm=1.0)


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


def test_predict_in_flight_counts_the_run(fresh_attempts):
    tl = ex.measured_pipeline("1f1b", 2, 4)                 # the real two-rank run
    assert [ex.measured_in_flight(tl, r) for r in (0, 1)] == peak_in_flight(make_schedule("1f1b", 2, 4))
    good = ex.check_predict_in_flight(2)
    assert good and "run's bubble" in good.message
    judged(ex.check_predict_in_flight, 2, Wrong(4, "AFAB's"), Wrong(1, "last rank's"),
           Wrong(3, "run / prediction"))
    assert ex.check_predict_in_flight(4, schedule="afab")


def test_bubble_needs_transfers():
    assert "t_comm > 0" in ex.check_bubble(4, 8, 3 / 11, t_comm=0).message


def test_the_reader_schedule_is_what_the_ranks_run(tmp_path):
    """`executing` really swaps the executor's plan: under --schedule 1f1b the ranks run
    AFAB's order when told to (all forwards of rank 0 before its first backward)."""
    from minipar.plan.config import ParallelConfig
    from minipar.plan import traces
    from minipar.plan.config import TrainConfig
    from minipar.plan.schedule_analysis import pipeline_events
    from minipar.runtime.run import train
    with ex.executing(make_schedule("afab", 2, 4)):
        train(TrainConfig(parallel=ParallelConfig(pp=2, schedule="1f1b", microbatches=4),
                          global_batch=4, seq_len=32, steps=1, progress=False, profile=str(tmp_path)))
    done = pipeline_events(traces.load(tmp_path))
    kinds = [e["kind"] for e in sorted(done, key=lambda e: e["start"]) if e["rank"] == 0]
    assert kinds == ["F"] * 4 + ["B"] * 4


def test_replayed_bubble(fresh_attempts):
    """1F1B's replayed bubble: the slowest-stage model of the notebook's solution is right;
    the formula's, for equal stages, is wrong with the hint that names the last stage."""
    from minipar.teach import replays
    from minipar.teach.numbers.pipeline_parallel import stage_compute_s
    p, m = 4, 8
    work = stage_compute_s(replays.replayed("pipeline_parallel").trace)
    step = sum(work[r] for r in range(p - 1)) / m + work[p - 1]
    judged(ex.check_replayed_bubble, 1 - sum(work.values()) / (p * step),
           Wrong(3 / 11, "equal stages"))
