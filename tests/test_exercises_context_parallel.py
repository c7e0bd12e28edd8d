"""The context-parallel chapter's checks: a right answer passes, the typical wrong ones fail
with a message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

import torch

from minipar.config import ModelConfig
from minipar.formulas.context_parallel import cp_wire_bytes_per_step
from minipar.parallel.context import contiguous_chunks, merge, zigzag_chunks
from minipar.teach.exercises import context_parallel as ex


def _naive_merge(o1, l1, o2, l2):       # right in exact arithmetic, overflows in float32
    w1, w2 = torch.exp(l1), torch.exp(l2)
    return (w1[..., None] * o1 + w2[..., None] * o2) / (w1 + w2)[..., None], torch.log(w1 + w2)


def test_lse_merge_right_naive_and_unweighted():
    assert ex.check_lse_merge(merge)
    naive = ex.check_lse_merge(_naive_merge)
    assert naive.ok is False and "step 1" in naive.message and "nan" in naive.message
    summed = ex.check_lse_merge(lambda o1, l1, o2, l2: (o1 + o2, torch.logaddexp(l1, l2)))
    assert summed.ok is False and "step 0" in summed.message and "max |difference|" in summed.message
    assert ex.check_lse_merge(None).ok is None


def test_zigzag_fix_catches_the_shipped_bug_and_a_contiguous_split():
    assert ex.check_zigzag_fix(zigzag_chunks)
    bug = ex.check_zigzag_fix(ex.buggy_zigzag_chunks)
    assert bug.ok is False and "work per rank" in bug.message
    assert ex.check_zigzag_fix(contiguous_chunks).ok is False
    missing = ex.check_zigzag_fix(lambda r, cp: (r, 2 * cp - r))
    assert missing.ok is False and "once" in missing.message
    assert ex.check_zigzag_fix(None).ok is None


def test_predict_cp_bytes_reports_the_ratio():
    want = cp_wire_bytes_per_step(ModelConfig.preset("tiny"), 8, 32, 2, "allgather")
    good = ex.check_predict_cp_bytes(want)
    assert good and "= 1.0000" in good.message
    assert "reduce-scatter" in ex.check_predict_cp_bytes(want // 2).message
    off = ex.check_predict_cp_bytes(want * 3)
    assert off.ok is False and "run / prediction" in off.message
    assert ex.check_predict_cp_bytes(None).ok is None


def test_number_and_zigzag_positions():
    assert ex.check_contiguous_imbalance(1024, 4, None).ok is None
    assert ex.check_contiguous_imbalance(1024, 4, 4.0).ok is False
    assert ex.check_zigzag(lambda s, r, cp: [i for c in zigzag_chunks(r, cp)
                                             for i in range(c * s // (2 * cp), (c + 1) * s // (2 * cp))])
    assert ex.check_zigzag(lambda s, r, cp: list(range(r * s // cp, (r + 1) * s // cp))).ok is False
