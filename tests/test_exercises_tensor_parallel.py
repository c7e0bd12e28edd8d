"""The tensor-parallel chapter's checks: a right answer passes, the typical wrong ones fail
with a message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

import torch
import torch.distributed as dist

from minipar.plan.config import ModelConfig
from minipar.plan.formulas.tensor_parallel import tp_wire_bytes_per_step
from minipar.plan.formulas.collectives import wire_bytes
from minipar.teach.exercises import tensor_parallel as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def _megatron(reduce_forward: bool):
    """Megatron's f (identity forward, all-reduce backward) or, reduce_forward, its g."""
    def summed(t):
        t = t.clone()
        dist.all_reduce(t)
        return t

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return summed(x) if reduce_forward else x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad if reduce_forward else summed(grad)
    return Op.apply


F, G = _megatron(False), _megatron(True)


def tp_block_bytes(tokens, dim, tp, act_bytes, sp):
    """Written from the chapter: f and g around attention and the MLP, forward and backward,
    each summing a full [tokens, dim] tensor with a ring all-reduce (under SP a
    reduce-scatter and an all-gather of it: the same bytes)."""
    return 4 * 2 * (tp - 1) / tp * tokens * dim * act_bytes


def test_tp_block_bytes_bug_against_the_trainers_steps_and_its_hints():
    forward_only = lambda t, h, tp, nb, sp: tp_block_bytes(t, h, tp, nb, sp) / 2
    sp_half = lambda t, h, tp, nb, sp: tp_block_bytes(t, h, tp, nb, sp) / (2 if sp else 1)
    sharded = lambda t, h, tp, nb, sp: tp_block_bytes(t, h, tp, nb, sp) / tp
    elements = lambda t, h, tp, nb, sp: tp_block_bytes(t, h, tp, nb, sp) / nb
    n_not = lambda t, h, tp, nb, sp: 4 * 2 * t * h * nb
    assert 4 * wire_bytes("all_reduce", 8, 8192 * 16384 * 2) == tp_block_bytes(8192, 16384, 8, 2, False)
    judged(ex.check_tp_block_bytes, tp_block_bytes, Wrong(forward_only, "backward pass"),
           Wrong(sp_half, "reduce-scatter and an all-gather"), Wrong(sharded, "full-size"),
           Wrong(elements, "counts elements"), Wrong(n_not, "t-1 steps, not t"),
           Wrong(ex.buggy_tp_block_bytes, "one sum per block"))


def test_f_and_g_right_and_the_two_usual_mistakes():
    assert ex.check_f_and_g(F, G)
    missing_f = ex.check_f_and_g(lambda x: x, G)
    assert missing_f.ok is False and "x.grad" in missing_f.message and "step 0" in missing_f.message
    swapped = ex.check_f_and_g(G, F)
    assert swapped.ok is False and "max |difference|" in swapped.message
    assert ex.check_f_and_g(None, None).ok is None


def test_row_parallel_bias_after_the_sum():
    judged(ex.check_row_parallel_linear, lambda x, w, b, g: g(x @ w.T) + b,
           Wrong(ex.buggy_row_parallel_linear, "y["))


def test_column_parallel_rejects_a_local_only_answer():
    assert ex.check_column_parallel(lambda x, w: x @ w.T).ok is False


def test_predict_tp_bytes_reports_the_ratio(fresh_attempts):
    tiny, t = ModelConfig.preset("tiny"), 4
    ring = tp_wire_bytes_per_step(tiny, 8, 32, t, sp=True)        # the chapter's count: the ring's
    # on gloo each of SP's 4L + 2 reduce-scatters of a [b, s, h] activation sends 2(t-1)/t of it
    want = ring + (4 * tiny.n_layers + 2) * (t - 1) * (8 * 32 * tiny.dim * 4) // t
    good = ex.check_predict_tp_bytes(want)                        # runs on 4 gloo ranks
    assert good and "run / prediction" in good.message
    judged(ex.check_predict_tp_bytes, want, Wrong(ring, "gloo"),
           Wrong(want // 2, "run / prediction"))                  # within 2x: shown


def test_replayed_tp_exposure(fresh_attempts):
    """Plain SP's exposed TP time, as the replay times it: right within 15%; the forward's
    collectives alone, or the collective matmul's, are wrong with the hint that says why."""
    from minipar.teach import replays
    plain = replays.replayed("tensor_parallel").exposed_s["tp"] * 1e3
    ring = replays.replayed("tensor_parallel_overlap").exposed_s["tp"] * 1e3
    judged(ex.check_replayed_tp_exposure, plain * 0.95, Wrong(plain / 2, "forward's collectives"),
           Wrong(ring, "collective matmul"))
