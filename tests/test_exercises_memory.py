"""The memory chapter's checks: a right answer passes, the typical wrong ones fail with a
message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

from minipar import costmodel as cm
from minipar.config import ModelConfig, ParallelConfig
from minipar.costmodel.memory import memory_of_rank
from minipar.recompute import recomputed
from minipar.teach.exercises import memory as ex


def test_predict_activations_reports_the_ratio():
    b, s = ex.PREDICT_BATCH
    work = cm.Workload(seq_len=s, global_batch=b, microbatch_size=b)
    want = memory_of_rank(ModelConfig.preset("tiny"), ParallelConfig(), work, cm.FP32, 0)["activations"]
    good = ex.check_predict_activations(want)
    assert good and "= 1.0000" in good.message
    off = ex.check_predict_activations(0.8 * want)
    assert off.ok is False and "run / prediction" in off.message
    assert ex.check_predict_activations(None).ok is None


def test_recompute_bug_no_recompute_and_the_real_one():
    assert ex.check_recompute(recomputed)
    bug = ex.check_recompute(ex.buggy_recompute)
    assert bug.ok is False and "grad is None" in bug.message and "step 0" in bug.message
    keeps_all = ex.check_recompute(lambda fn, x: fn(x))
    assert keeps_all.ok is False and "budget" in keeps_all.message
    assert ex.check_recompute(None).ok is None


def test_will_it_fit_enforces_the_budget():
    assert ex.check_will_it_fit(dict(tp=8, pp=2, recompute="full"))
    too_big = ex.check_will_it_fit(dict(tp=8, pp=2))
    assert too_big.ok is False and "over the budget" in too_big.message
    assert ex.check_will_it_fit(dict(tp=8, pp=4)).ok is False          # 32 GPUs, not 16
    assert ex.check_will_it_fit(None).ok is None


def test_bytes_per_param():
    assert ex.check_bytes_per_param(18)
    assert "16-bit" in ex.check_bytes_per_param(16).message
    assert ex.check_bytes_per_param(None).ok is None
