"""The context-parallel chapter's checks: a right answer passes, the typical wrong ones fail
with a message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

import torch

from minipar.runtime import wire_meter
from minipar.plan.config import ModelConfig
from minipar.plan.formulas.context_parallel import cp_wire_bytes_per_step
from minipar.trainer.parallel.context import merge, zigzag_chunks
from minipar.trainer.parallel.context_analysis import attention_work, contiguous_chunks
from minipar.teach.exercises import context_parallel as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def _naive_merge(o1, l1, o2, l2):       # right in exact arithmetic, overflows in float32
    w1, w2 = torch.exp(l1), torch.exp(l2)
    return (w1[..., None] * o1 + w2[..., None] * o2) / (w1 + w2)[..., None], torch.log(w1 + w2)


def test_lse_merge_right_naive_and_unweighted():
    naive, summed = judged(ex.check_lse_merge, merge, Wrong(_naive_merge, "step 1"),
                           Wrong(lambda o1, l1, o2, l2: (o1 + o2, torch.logaddexp(l1, l2)), "step 0"))
    assert "nan" in naive.message and "max |difference|" in summed.message


def test_zigzag_fix_catches_the_shipped_bug_and_a_contiguous_split():
    judged(ex.check_zigzag_fix, zigzag_chunks, Wrong(ex.buggy_zigzag_chunks, "work per rank"),
           contiguous_chunks, Wrong(lambda r, cp: (r, 2 * cp - r), "once"))


def test_predict_cp_bytes_is_measured_on_gloo(fresh_attempts):
    ring = cp_wire_bytes_per_step(ModelConfig.preset("tiny"), 8, 32, 2, "allgather")
    want = 3 * ring // 2        # gloo: the all-gather as the ring, the reduce-scatter an all-reduce
    measured = ex.measured_cp_bytes()                  # 8 all-gathers and 8 reduce-scatters
    assert 0 <= measured - want <= 16 * wire_meter.HEADER_BYTES
    good = ex.check_predict_cp_bytes(want)              # the run
    assert good and "run / prediction" in good.message
    judged(ex.check_predict_cp_bytes, want, Wrong(want * 3, "more than a factor of 2 above"),
           Wrong(ring, "Bytes on the wire, measured"), Wrong(ring // 2, "reduce-scatter"),
           measured=measured)                           # a first wild guess: no run; then hints
    again = ex.check_predict_cp_bytes(want * 4, measured=measured)      # a fourth try: the run
    assert again.ok is False and "run / prediction" in again.message
    asked = ex.check_predict_cp_bytes(want * 3, measured=measured, reveal=True)
    assert asked.ok is False and "run / prediction" in asked.message


def test_contiguous_imbalance_counted_on_ranks(fresh_attempts):
    # 8 chunks of c = 128: rank 3 does 13 full blocks and 2 triangles, rank 0 one and 2
    assert ex.counted_scores(1024, 4) == tuple(attention_work(1024, 4, contiguous_chunks))
    assert ex.counted_scores(1024, 4, zigzag_chunks) == tuple(attention_work(1024, 4))
    judged(ex.check_contiguous_imbalance, (13 * 128**2 + 128 * 129) / (128**2 + 128 * 129),
           Wrong(4.0, "diagonal block"), Wrong(7.0, "triangles"), Wrong(3.0, "run / prediction"))


def test_zigzag_positions():
    judged(ex.check_zigzag, lambda s, r, cp: [i for c in zigzag_chunks(r, cp)
                                              for i in range(c * s // (2 * cp), (c + 1) * s // (2 * cp))],
           lambda s, r, cp: list(range(r * s // cp, (r + 1) * s // cp)))


def test_replayed_cp_exposure(fresh_attempts):
    """The all-gather's exposed CP time, as the replay times it: right within 15%; the
    ring's zero, or the forward's gathers alone, are wrong with the hint that says why."""
    from minipar.teach import replays
    gather = replays.replayed("context_parallel_allgather").exposed_s["cp"] * 1e3
    judged(ex.check_replayed_cp_exposure, gather * 1.05, Wrong(0.0, "ring's"),
           Wrong(gather / 2, "forward's all-gathers"))
