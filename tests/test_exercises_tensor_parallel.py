"""The tensor-parallel chapter's checks: a right answer passes, the typical wrong ones fail
with a message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

import torch
import torch.distributed as dist

from minipar.config import ModelConfig
from minipar.formulas.tensor_parallel import tp_wire_bytes_per_step
from minipar.formulas.collectives import wire_bytes
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


def test_allreduce_bytes():
    size = 1 * 8192 * 16384 * 2
    judged(ex.check_tp_allreduce_bytes, wire_bytes("all_reduce", 8, size), Wrong(size, "2(n-1)/n"),
           args=(8, 1, 8192, 16384, 2))


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
    want = tp_wire_bytes_per_step(ModelConfig.preset("tiny"), 8, 32, 4, sp=True)
    good = ex.check_predict_tp_bytes(want)
    assert good and "= 1.0000" in good.message
    judged(ex.check_predict_tp_bytes, want, Wrong(want // 2, "run / prediction"))   # within 2x: shown
