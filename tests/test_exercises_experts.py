"""The experts chapter's checks: a right answer passes, the typical wrong ones fail with a
message that says where, and no answer is "not answered yet"."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from minipar.plan.formulas.experts import all_to_all_wire_bytes
from minipar.runtime import wire_meter
from minipar.teach.exercises import experts as ex
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def exchanged(counts, axis):                # the answer: one all-to-all of one count per expert
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts, group=axis.group)
    return out.view(axis.size, -1)


def weighted(out, token, weight, n_tokens):
    return out.new_zeros(n_tokens, out.shape[-1]).index_add(0, token, out * weight[:, None])


def test_predict_ep_bytes_is_measured_on_gloo(fresh_attempts):
    """Rank 0 keeps its copies for expert 0 and sends those for expert 7: one row per token in
    each of four all-to-alls, and its four counts in the count exchange."""
    tokens, row = ex.SEQS * ex.TOKENS, ex.LAYER.dim * 4
    one = all_to_all_wire_bytes([tokens, tokens], 0, row)
    counts = all_to_all_wire_bytes([1, 1], 0, ex.LAYER.moe_experts // ex.EP * 8)
    want = 4 * one + counts
    measured = ex.measured_ep_bytes()
    assert 0 <= measured - want <= 5 * wire_meter.HEADER_BYTES
    good = ex.check_predict_ep_bytes(want)                      # the run
    assert good and "run / prediction" in good.message
    judged(ex.check_predict_ep_bytes, want, Wrong(2 * one, "backward"),
           Wrong(8 * one, "sends nothing to itself"), Wrong(one, "one all-to-all"),
           Wrong(want * 5, "run / prediction"), measured=measured)


def test_count_exchange_on_four_ranks():
    judged(ex.check_count_exchange, exchanged,
           Wrong(lambda counts, axis: counts.view(axis.size, -1), "theirs["),   # no exchange
           Wrong(lambda counts, axis: exchanged(counts, axis).t(), "theirs["))


def test_combine_fix_catches_the_forgotten_weights():
    judged(ex.check_combine_fix, weighted,
           Wrong(ex.buggy_combine, "router's gradient is zero"),
           Wrong(lambda out, token, weight, n: weighted(out, token, weight.sqrt(), n), "step 0"))


def test_predict_capacity_counts_what_the_experts_receive(fresh_attempts):
    c, k, e = ex.CAPACITY, ex.LAYER.moe_top_k, ex.LAYER.moe_experts
    kept = c["seqs"] * len(ex.FORCED) * math.ceil(c["factor"] * c["tokens"] * k / e)
    assert ex.copies_computed(c["seqs"], c["tokens"], c["factor"]) == kept
    assert ex.copies_computed(c["seqs"], c["tokens"], 0.0) == c["seqs"] * c["tokens"] * k
    judged(ex.check_predict_capacity, kept, Wrong(c["seqs"] * c["tokens"] * k, "dropless"),
           Wrong(kept - c["seqs"] * len(ex.FORCED), "rounds up"),
           Wrong(kept * 3, "run / prediction"))
