"""All four axes at once: mixed layouts give the single-device loss curve, and so does the
full 2x2x2x2 = 16-rank layout on a 2-core machine."""
import pytest

from helpers import assert_same_losses, reference, run_layout

STEPS = 3

MIXED = {
    "tp2-pp2-interleaved": dict(tp=2, pp=2, schedule="interleaved", virtual_stages=2, microbatches=2),
    "tp2sp-cp2-allgather": dict(tp=2, sp=True, cp=2, cp_impl="allgather"),
    "cp2-pp2-zb-dp2": dict(cp=2, pp=2, schedule="zb", dp=2, microbatches=2),
    "tp2-dp2-zero3-cp2": dict(tp=2, dp=2, zero=3, cp=2),
    "pp4-afab-tp2": dict(pp=4, schedule="afab", tp=2, microbatches=4),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", MIXED)
def test_mixed_layouts_match_single_device(name):
    assert_same_losses(run_layout(steps=STEPS, capture_grads=False, **MIXED[name]),
                       reference(steps=STEPS, capture_grads=False))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sixteen_ranks_2x2x2x2_match_single_device():
    out = run_layout(steps=STEPS, capture_grads=False, tp=2, cp=2, pp=2, dp=2, sp=True, zero=1,
                     microbatches=2)
    assert_same_losses(out, reference(steps=STEPS, capture_grads=False))
    assert len(out["all"]) == 16
    comm = out["records"][-1]["comm"]
    # rank 0 talks on every axis
    assert {"tp", "cp", "pp", "dp"} <= set(comm)
