"""The MFU chapter's checks accept the right answer, reject the typical wrong ones, and say
"not answered" for None; the predict-then-run check runs minipar once (two forked ranks)."""
from minipar.plan import flops
from minipar.runtime import wire_meter
from minipar.plan.config import ModelConfig
from minipar.plan.flops import param_count
from minipar.teach.exercises import mfu as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)

L405 = ModelConfig.preset("llama3-405b")


def test_predict_step_flops_counts_the_real_model(fresh_attempts):
    tiny, tokens = ModelConfig.preset("tiny"), ex.STEP["batch"] * ex.STEP["seq_len"]
    palm = flops.flops_per_token(tiny, ex.STEP["seq_len"]) * tokens       # 6 N + 12 L h s
    judged(ex.check_predict_step_flops, palm,
           Wrong(flops.dense_flops_per_token(tiny) * tokens, "attention"),
           Wrong(6 * param_count(tiny) * tokens, "lookup"), Wrong(palm / 3, "prediction"))


def test_attention_crossover_counted_on_the_real_model(fresh_attempts):
    m = ModelConfig.preset("llama3-8b")
    palm = flops.dense_flops_per_token(m) / (12 * m.n_layers * m.dim)   # 6 N = 12 L h s
    judged(ex.check_attention_crossover, palm,
           Wrong(6 * param_count(m) / (12 * m.n_layers * m.dim), "lookup"),
           Wrong(2 * palm, "causal mask"), Wrong(palm / 3, "6 N"), Wrong(palm / 8, "run / prediction"))


def test_fixed_mfu():
    def half_fixed(tps, m, s, peak, n):        # attention added, embedding still counted
        return tps * (6 * param_count(m) + 12 * m.n_layers * m.dim * s) / (peak * n)
    judged(ex.check_fixed_mfu, flops.mfu, ex.buggy_mfu, Wrong(half_fixed, "embedding"))


def test_predict_dp_bytes_is_measured_on_gloo(fresh_attempts):
    ring = ex.dp_model_bytes()          # the cost model counts the ring: reduce-scatter + all-gather
    want = 3 * ring // 2                # gloo's reduce-scatter is an all-reduce: twice the ring's
    measured = ex.dp_run_bytes()                  # the real two-rank run
    assert 0 <= measured - want <= 5 * wire_meter.HEADER_BYTES
    judged(ex.check_predict_dp_bytes, want, Wrong(ring, "Bytes on the wire, measured"),
           Wrong(2 * ring, "prediction"), measured=measured)        # an all-reduce on top
    assert ex.check_predict_dp_bytes(want)        # the run itself, through the check
