"""The llama3 chapter's checks accept the right answer, reject the typical wrong ones, and
say "not answered" for None."""
from minipar.plan.config import ModelConfig
from minipar.plan.costmodel.table4 import TABLE4
from minipar.plan.flops import layer_param_count, param_count
from minipar.teach.exercises import llama3 as ex
from verdicts import Wrong, judged, peeling


def test_param_count():
    def no_gqa(m):          # K and V as wide as Q
        return param_count(m) + 2 * m.n_layers * m.dim * (m.dim - m.n_kv_heads * m.head_dim)

    def tied_twice(m):      # the tied table counted as two
        return param_count(m) + (m.vocab_size * m.dim if m.tie_embeddings else 0)
    judged(ex.check_param_count, param_count, Wrong(no_gqa, "GQA"), tied_twice,
           lambda m: m.n_layers * layer_param_count(m))


def _coords(rank, t, c, p, d):
    return rank % t, rank // t % c, rank // (t * c) % p, rank // (t * c * p)


def _as_tuple(coords):
    """The same mapping, answered as (tp, cp, pp, dp), the form this exercise asks for."""
    return lambda *a: tuple(coords(*a)[axis] for axis in ("tp", "cp", "pp", "dp"))


def test_rank_coords():
    judged(ex.check_rank_coords, _coords, _as_tuple(peeling("dp", "pp", "cp", "tp")),
           _as_tuple(peeling("tp", "pp", "cp", "dp")))


def test_model_state_gb():
    # 18 bytes: bf16 weights 2, fp32 gradients 4 (the paper's Section 3.3.2), master + m + v 12
    row, n = TABLE4[0], param_count(ModelConfig.preset("llama3-405b"))
    split = row.tp * row.pp
    judged(ex.check_model_state_gb, n * 18 / split / 1e9,
           Wrong(n * 16 / split / 1e9, "fp32"), Wrong(n * 18 / row.gpus / 1e9, "DP replicates"),
           Wrong(n * 18 / split / 2**30, "GiB"))
    judged(ex.check_model_state_gb, n * (6 + 12 / row.dp) / split / 1e9,
           n * 18 / split / 1e9, Wrong(n * (4 + 12 / row.dp) / split / 1e9, "fp32"), zero1=True)


def test_param_count_is_the_real_models():
    for args in ex.PARAM_CASES:
        assert ex.model_params(*args) == param_count(*args)


def test_straddling_replicas():
    judged(ex.check_straddling_replicas, [1, 4, 7], [1, 4], [], Wrong([2, 5, 8], "from 0"))


def test_the_figure_and_the_numbers_agree_on_which_replicas_straddle():
    from minipar.teach.figures.llama3 import replica_pods
    from minipar.runtime.topology import straddling_replicas
    for row in TABLE4:
        pods = replica_pods(row.tp, row.cp, row.pp, row.dp, 3072)
        mine = [r for r, p in enumerate(pods) if len(p) > 1]
        assert mine == straddling_replicas(row.tp * row.cp * row.pp, row.gpus, 3072)


def test_predict_stage_params_runs_minipar():
    from minipar.plan.config import ModelConfig
    want = ex.stage_model_params()
    measured = ex.stage_run_params()               # the real four-rank run
    assert measured == want
    m = ModelConfig.preset("tiny")
    norms_sharded = want - 4 * m.dim // 2          # the final norm split over TP: wrong
    judged(ex.check_predict_stage_params, want, norms_sharded, 4 * param_count(m) / 4, measured=measured)
