"""The memory chapter's checks: a right answer passes, the typical wrong ones fail with a
message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

from minipar.plan import costmodel as cm
from minipar.plan.config import ModelConfig, ParallelConfig
from minipar.plan.costmodel.memory import memory_of_rank
from minipar.trainer.recompute import recomputed
from minipar.teach.exercises import memory as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def test_predict_activations_reports_the_ratio(fresh_attempts):
    b, s = ex.PREDICT_BATCH
    work = cm.Workload(seq_len=s, global_batch=b, microbatch_size=b)
    want = memory_of_rank(ModelConfig.preset("tiny"), ParallelConfig(), work, cm.FP32, 0)["activations"]
    good = ex.check_predict_activations(want)
    assert good and "= 1.0000" in good.message
    judged(ex.check_predict_activations, want, Wrong(0.8 * want, "run / prediction"))   # near: shown


def test_recompute_bug_no_recompute_and_the_real_one():
    bug, _ = judged(ex.check_recompute, recomputed, Wrong(ex.buggy_recompute, "grad is None"),
                    Wrong(lambda fn, x: fn(x), "budget"))
    assert "step 0" in bug.message


def test_will_it_fit_applies_the_planners_headroom():
    from minipar.plan.costmodel.planner import memory_budget_gb
    budget = memory_budget_gb(ex.FIT.cluster)
    over, *_ = judged(ex.check_will_it_fit, dict(tp=8, pp=4, recompute="selective"),
                      Wrong(dict(tp=2, pp=2), "largest part is the activations"),
                      Wrong(dict(tp=8, pp=1, recompute="full"), "over the"),
                      Wrong(dict(tp=8, dp=2), "32 GPUs"),
                      Wrong(dict(tp=8, pp=4, virtual=2), "not among them"))
    assert f"{budget:.1f} GB" in over.message and "headroom" in over.message
    # the budget is the HBM less the headroom, not the HBM: a layout between the two fails
    tight = ex.check_will_it_fit(dict(tp=4, pp=4, recompute="selective"))     # 82 GB of 85.9
    assert tight.ok is False and "headroom" in tight.message


def test_bytes_per_param_runs_zero1(fresh_attempts):
    measured = ex.measured_state_bytes_per_param()         # the real two-rank run
    assert measured == 4 + 4 + 8 / 2                       # fp32 weight, gradient; half of m, v
    judged(ex.check_bytes_per_param, 12, Wrong(16, "without ZeRO"), Wrong(18, "float32"),
           Wrong(8, "run / prediction"), measured=measured)
