"""The llama3 chapter's checks accept the right answer, reject the typical wrong ones, and
say "not answered" for None."""
from minipar.plan.costmodel.table4 import TABLE4
from minipar.plan.flops import layer_param_count, param_count
from minipar.teach.exercises import llama3 as ex
from verdicts import Wrong, fresh_attempts, judged, peeling  # noqa: F401 (a fixture)


def test_param_count_bug():
    def no_gqa(m):          # K and V as wide as Q
        return param_count(m) + 2 * m.n_layers * m.dim * (m.dim - m.n_kv_heads * m.head_dim)

    def tied_twice(m):      # the tied table counted as two
        return param_count(m) + (m.vocab_size * m.dim if m.tie_embeddings else 0)
    judged(ex.check_param_count, param_count, Wrong(ex.buggy_param_count, "off by"),
           Wrong(no_gqa, "GQA"), tied_twice, lambda m: m.n_layers * layer_param_count(m))


def _coords(rank, t, c, p, d):
    return rank % t, rank // t % c, rank // (t * c) % p, rank // (t * c * p)


def _as_tuple(coords):
    """The same mapping, answered as (tp, cp, pp, dp), the form this exercise asks for."""
    return lambda *a: tuple(coords(*a)[axis] for axis in ("tp", "cp", "pp", "dp"))


def test_rank_coords():
    judged(ex.check_rank_coords, _coords, _as_tuple(peeling("dp", "pp", "cp", "tp")),
           _as_tuple(peeling("tp", "pp", "cp", "dp")))


def test_published_layout_critiqued_by_memory_placement_and_planner(fresh_attempts):
    """Table 4's row 1 as published, without recomputation, overflows by its activations;
    with selective recomputation it fits and is the planner's best; 16 stages without
    interleaving lose to the bubble; ZeRO-3 with full recomputation fits but costs time."""
    published = dict(tp=8, pp=16, schedule="interleaved", virtual_stages=8)
    over, bubble, *_ = judged(
        ex.check_published_layout, {**published, "recompute": "selective"},
        Wrong(published, "largest part is the activations"),
        Wrong(dict(tp=8, pp=16, recompute="selective"), "bubble"),
        Wrong(dict(tp=8, pp=16, zero=3, recompute="full"), "ZeRO-3 costs time"),
        Wrong(dict(tp=8, pp=8, dp=64), "tp x cp x pp x dp"), Wrong(dict(tp=16, pp=8), "cannot run"),
        Wrong("TP8", "give a dict"))
    assert "headroom" in over.message and "TP8 CP1" not in bubble.message   # the best stays hidden
    again = ex.check_published_layout(dict(tp=8, pp=16, zero=2, recompute="selective"))
    assert again.ok is False and "planner's TP8 CP1 PP16" in again.message  # a second layout: shown


def test_param_count_is_the_real_models():
    for args in ex.PARAM_CASES:
        assert ex.model_params(*args) == param_count(*args)


def test_straddling_replicas_bug():
    from minipar.runtime.topology import straddling_replicas
    judged(ex.check_straddling_replicas, straddling_replicas,
           Wrong(ex.buggy_straddling_replicas, "sit in one pod"),
           Wrong(lambda g, w, pod: [], "missing"), Wrong(lambda g, w, pod: 1 / 0, "ZeroDivisionError"))
    for case in ex.STRADDLE_CASES:                      # the grid's count is the topology's
        tp, cp, pp, dp, pod = case
        assert ex.replicas_across_pods(*case) == straddling_replicas(tp * cp * pp, tp * cp * pp * dp, pod)


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
