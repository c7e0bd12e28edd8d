"""The MFU chapter's checks accept the right answer, reject the typical wrong ones, and say
"not answered" for None; the predict-then-run check runs minipar once (two forked ranks)."""
from minipar import flops
from minipar.config import ModelConfig
from minipar.flops import param_count
from minipar.teach.exercises import mfu as ex
from verdicts import Wrong, judged

L405 = ModelConfig.preset("llama3-405b")


def test_mfu_number():
    tps = 2048 * 8192 / 12.6
    right = flops.mfu(tps, L405, 8192, 989e12, 8192)
    judged(ex.check_mfu, right, Wrong(100 * right, "fraction"), args=(L405, 8192, tps, 8192, 989e12))
    assert ex.check_mfu(L405, 8192, tps, 8192, 989e12, f"{100 * right:.2f}%")     # a percentage is read


def test_flops_per_token():
    judged(ex.check_flops_per_token, flops.flops_per_token, lambda m, s: flops.dense_flops_per_token(m))


def test_fixed_mfu():
    def half_fixed(tps, m, s, peak, n):        # attention added, embedding still counted
        return tps * (6 * param_count(m) + 12 * m.n_layers * m.dim * s) / (peak * n)
    judged(ex.check_fixed_mfu, flops.mfu, ex.buggy_mfu, Wrong(half_fixed, "embedding"))


def test_predict_dp_bytes_runs_minipar():
    want = ex.dp_model_bytes()
    measured = ex.dp_run_bytes()                  # the real two-rank run
    assert measured == want
    judged(ex.check_predict_dp_bytes, want, Wrong(2 * want, "0.5000"), measured=measured)   # an all-reduce's
