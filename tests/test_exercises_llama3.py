"""The llama3 chapter's checks accept the right answer, reject the typical wrong ones, and
say "not answered" for None."""
from minipar.config import ModelConfig
from minipar.costmodel.table4 import TABLE4
from minipar.flops import layer_param_count, param_count
from minipar.teach.exercises import llama3 as ex


def test_param_count():
    assert ex.check_param_count(param_count)
    assert ex.check_param_count(None).ok is None

    def no_gqa(m):          # K and V as wide as Q
        return param_count(m) + 2 * m.n_layers * m.dim * (m.dim - m.n_kv_heads * m.head_dim)

    def tied_twice(m):      # the tied table counted as two
        return param_count(m) + (m.vocab_size * m.dim if m.tie_embeddings else 0)

    for wrong in (no_gqa, tied_twice, lambda m: m.n_layers * layer_param_count(m)):
        verdict = ex.check_param_count(wrong)
        assert verdict.ok is False, wrong
    assert "GQA" in ex.check_param_count(no_gqa).message


def _coords(rank, t, c, p, d):
    return rank % t, rank // t % c, rank // (t * c) % p, rank // (t * c * p)


def test_rank_coords():
    assert ex.check_rank_coords(_coords)
    assert ex.check_rank_coords(None).ok is None
    dp_innermost = lambda r, t, c, p, d: (r // (d * p * c), r // (d * p) % c, r // d % p, r % d)  # noqa: E731
    assert ex.check_rank_coords(dp_innermost).ok is False
    swapped_cp_pp = lambda r, t, c, p, d: (r % t, r // (t * p) % c, r // t % p, r // (t * c * p))  # noqa: E731
    assert ex.check_rank_coords(swapped_cp_pp).ok is False


def test_model_state_gb():
    row, n = TABLE4[0], param_count(ModelConfig.preset("llama3-405b"))
    assert ex.check_model_state_gb(n * 16 / (row.tp * row.pp) / 1e9)
    assert ex.check_model_state_gb(n * (4 + 12 / row.dp) / (row.tp * row.pp) / 1e9, zero1=True)
    assert ex.check_model_state_gb(n * 16 / row.gpus / 1e9).ok is False
    assert ex.check_model_state_gb(n * 16 / (row.tp * row.pp) / 2**30).ok is False
    assert ex.check_model_state_gb(None).ok is None


def test_straddling_replicas():
    assert ex.check_straddling_replicas([1, 4, 7])
    assert ex.check_straddling_replicas([1, 4]).ok is False      # the last pod counts too
    assert ex.check_straddling_replicas([]).ok is False
    assert ex.check_straddling_replicas(None).ok is None


def test_the_figure_and_the_numbers_agree_on_which_replicas_straddle():
    from minipar.teach.figures.llama3 import replica_pods
    from minipar.placement import straddling_replicas
    for row in TABLE4:
        pods = replica_pods(row.tp, row.cp, row.pp, row.dp, 3072)
        mine = [r for r, p in enumerate(pods) if len(p) > 1]
        assert mine == straddling_replicas(row.tp * row.cp * row.pp, row.gpus, 3072)


def test_predict_stage_params_runs_minipar():
    from minipar.config import ModelConfig
    want = ex.stage_model_params()
    measured = ex.stage_run_params()               # the real four-rank run
    assert measured == want
    assert ex.check_predict_stage_params(want, measured=measured)
    m = ModelConfig.preset("tiny")
    norms_sharded = want - 4 * m.dim // 2          # the final norm split over TP: wrong
    assert ex.check_predict_stage_params(norms_sharded, measured=measured).ok is False
    assert ex.check_predict_stage_params(4 * param_count(m) / 4, measured=measured).ok is False
    assert ex.check_predict_stage_params(None).ok is None
