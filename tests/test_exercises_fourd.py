"""The 4D chapter's checks accept the right answer, reject the typical wrong ones, and say
"not answered" for None (minipar/teach/exercises/fourd.py)."""
from minipar.plan.config import ModelConfig
from minipar.plan.flops import local_param_count
from minipar.plan.flops import param_count
from minipar.trainer.grid import ProcessGrid
from minipar.teach.exercises import fourd as ex
from verdicts import Wrong, fresh_attempts, judged, peeling  # noqa: F401 (a fixture)


def test_dp_group():
    def right(rank, tp, cp, pp, dp):
        stride = tp * cp * pp
        return [rank % stride + d * stride for d in range(dp)]

    def tp_group(rank, tp, cp, pp, dp):          # the usual mix-up: consecutive ranks
        return [rank // tp * tp + i for i in range(tp)]
    judged(ex.check_dp_group, right, tp_group)


def test_coords_bug():
    # pp before cp: right on 2x2x2x2, wrong on uneven grids
    judged(ex.check_coords_bug, lambda r, *s: ProcessGrid(*s).coords(r), ex.buggy_coords,
           peeling("tp", "pp", "cp", "dp"))


def test_predict_dp_bytes_runs_on_gloo_and_rejects_the_usual_mistakes():
    tiny = ModelConfig.preset("tiny")
    local = local_param_count(tiny, 2, tiny.n_layers, True, True)
    judged(ex.check_predict_dp_shard_bytes, 4 * local,                   # 2(n-1)/n x 4 B x local, n = 2
           Wrong(4 * param_count(tiny), "whole model"), Wrong(2 * local, "float32"))


def test_plan(fresh_attempts):
    assert ex.check_plan({"tp": 2, "cp": 1, "pp": 1})
    assert ex.check_plan({"tp": 2, "cp": 1, "pp": 2})                       # within 2 points
    short = ex.check_plan({"tp": 8, "cp": 1, "pp": 4})                     # TP8 on width 8,192
    assert short.ok is False and "TP2" not in short.message                 # not the planner's layout yet
    assert "loses most to tp" in short.message                              # what limits it, said
    again = ex.check_plan({"tp": 2, "cp": 2, "pp": 16})                    # the bubble of 16 stages
    assert again.ok is False and "the planner's TP2" in again.message       # a second try: shown
    assert "loses most to bubble" in again.message
    v = ex.check_plan({"tp": 8, "cp": 1, "pp": 1}, model="llama3-405b", gpus=64)
    assert v.ok is False and "does not fit" in v.message                    # rule 1
    v = ex.check_plan({"tp": 2, "cp": 16, "pp": 1})                         # 512 tokens per CP rank
    assert v.ok is False and "outside the planner's space" in v.message
    assert "cannot run" in ex.check_plan({"tp": 16, "cp": 1, "pp": 1}).message   # 8 KV heads
    assert "does not divide" in ex.check_plan({"tp": 3, "cp": 1, "pp": 1}).message
    assert ex.check_plan({"tp": 2}).ok is False                             # malformed
    assert ex.check_plan(None).ok is None
    assert "TP2" in ex.check_plan(None, reveal=True).message                # asked for
