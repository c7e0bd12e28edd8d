"""The MFU chapter's checks accept the right answer, reject the typical wrong ones, and say
"not answered" for None; the predict-then-run check runs minipar once (two forked ranks)."""
from minipar import flops
from minipar.config import ModelConfig
from minipar.flops import param_count
from minipar.teach.exercises import mfu as ex

L405 = ModelConfig.preset("llama3-405b")


def test_mfu_number():
    tps = 2048 * 8192 / 12.6
    right = flops.mfu(tps, L405, 8192, 989e12, 8192)
    assert ex.check_mfu(L405, 8192, tps, 8192, 989e12, right)
    assert ex.check_mfu(L405, 8192, tps, 8192, 989e12, 100 * right).ok is False
    assert ex.check_mfu(L405, 8192, tps, 8192, 989e12, None).ok is None


def test_flops_per_token():
    assert ex.check_flops_per_token(flops.flops_per_token)
    assert ex.check_flops_per_token(lambda m, s: flops.dense_flops_per_token(m)).ok is False
    assert ex.check_flops_per_token(None).ok is None


def test_fixed_mfu():
    assert ex.check_fixed_mfu(flops.mfu)
    assert ex.check_fixed_mfu(ex.buggy_mfu).ok is False

    def half_fixed(tps, m, s, peak, n):        # attention added, embedding still counted
        return tps * (6 * param_count(m) + 12 * m.n_layers * m.dim * s) / (peak * n)

    verdict = ex.check_fixed_mfu(half_fixed)
    assert verdict.ok is False and "embedding" in verdict.message
    assert ex.check_fixed_mfu(None).ok is None


def test_predict_dp_bytes_runs_minipar():
    want = ex.dp_model_bytes()
    measured = ex.dp_run_bytes()                  # the real two-rank run
    assert measured == want
    assert ex.check_predict_dp_bytes(want, measured=measured)
    verdict = ex.check_predict_dp_bytes(2 * want, measured=measured)   # an all-reduce's bytes
    assert verdict.ok is False and "0.5000" in verdict.message
    assert ex.check_predict_dp_bytes(None).ok is None
