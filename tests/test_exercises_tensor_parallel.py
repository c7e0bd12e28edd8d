"""The tensor-parallel chapter's checks: a right answer passes, the typical wrong ones fail
with a message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

import torch
import torch.distributed as dist

from minipar.config import ModelConfig
from minipar.formulas.tensor_parallel import tp_wire_bytes_per_step
from minipar.formulas.collectives import wire_bytes
from minipar.teach.exercises import tensor_parallel as ex


class _F(torch.autograd.Function):          # Megatron's f: identity, all-reduce backward
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _G(torch.autograd.Function):          # Megatron's g: all-reduce, identity backward
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def test_allreduce_bytes():
    size = 1 * 8192 * 16384 * 2
    assert ex.check_tp_allreduce_bytes(8, 1, 8192, 16384, 2, wire_bytes("all_reduce", 8, size))
    wrong = ex.check_tp_allreduce_bytes(8, 1, 8192, 16384, 2, size)
    assert wrong.ok is False and "2(n-1)/n" in wrong.message
    assert ex.check_tp_allreduce_bytes(8, 1, 8192, 16384, 2, None).ok is None


def test_f_and_g_right_and_the_two_usual_mistakes():
    assert ex.check_f_and_g(_F.apply, _G.apply)
    missing_f = ex.check_f_and_g(lambda x: x, _G.apply)
    assert missing_f.ok is False and "x.grad" in missing_f.message and "step 0" in missing_f.message
    swapped = ex.check_f_and_g(_G.apply, _F.apply)
    assert swapped.ok is False and "max |difference|" in swapped.message
    assert ex.check_f_and_g(None, None).ok is None


def test_row_parallel_bias_after_the_sum():
    assert ex.check_row_parallel_linear(lambda x, w, b, g: g(x @ w.T) + b)
    bug = ex.check_row_parallel_linear(ex.buggy_row_parallel_linear)
    assert bug.ok is False and "y[" in bug.message
    assert ex.check_row_parallel_linear(None).ok is None


def test_column_parallel_rejects_a_local_only_answer():
    assert ex.check_column_parallel(lambda x, w: x @ w.T).ok is False


def test_predict_tp_bytes_reports_the_ratio():
    want = tp_wire_bytes_per_step(ModelConfig.preset("tiny"), 8, 32, 4, sp=True)
    good = ex.check_predict_tp_bytes(want)
    assert good and "= 1.0000" in good.message
    off = ex.check_predict_tp_bytes(want // 2)
    assert off.ok is False and "run / prediction" in off.message
    assert ex.check_predict_tp_bytes(None).ok is None
