"""The hf chapter's checks accept the right answer and reject the usual wrong ones, and the
facts they and the chapter's figures rest on are the package's."""
from __future__ import annotations

import math

import torch

from minipar.plan.config import ModelConfig
from minipar.trainer.grid import ProcessGrid
from minipar.runtime.launch import run_local
from minipar.trainer.parallel.tensor import apply_tensor_parallel
from minipar.trainer.model import Transformer
from minipar.trainer.placement import Replicate, Shard, placements
from minipar.teach.exercises import hf as ex
from minipar.teach.figures.hf import TP_DIM
from verdicts import Wrong, fresh_attempts, judged  # noqa: F401 (a fixture)


def read_tp(sl, tp_dim, tp_rank, tp_size):
    if tp_dim is None:
        return sl[:]
    k = sl.get_shape()[tp_dim] // tp_size
    return sl[tp_rank * k:(tp_rank + 1) * k] if tp_dim == 0 else sl[:, tp_rank * k:(tp_rank + 1) * k]


def hf_permute(w, n_heads):        # transformers' convert_llama_weights_to_hf.py
    d = w.shape[0] // n_heads
    return w.view(n_heads, d // 2, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


def test_tp_slice_on_gloo_ranks():
    def always_rows(sl, tp_dim, tp_rank, tp_size):    # forgets row-parallel weights
        return read_tp(sl, None if tp_dim is None else 0, tp_rank, tp_size)

    def rank_zero_everywhere(sl, tp_dim, tp_rank, tp_size):
        return read_tp(sl, tp_dim, 0, tp_size)
    judged(ex.check_tp_slice, read_tp, Wrong(always_rows, "o_proj"), Wrong(rank_zero_everywhere, "rank 1"))


def test_rope_permute():
    def inverse(w, n_heads):       # the classic bug: the permutation the other way round
        d = w.shape[0] // n_heads
        return w.view(n_heads, 2, d // 2, w.shape[1]).transpose(1, 2).reshape(w.shape)
    judged(ex.check_rope_permute, hf_permute, inverse, lambda w, n: w)


def test_meta_rope_matches_hf_rope_after_the_permutation_per_vector():
    # the check's truth: rotating pairs (2i, 2i+1) then permuting = permuting then (i, i+d/2)
    x, pos = torch.randn(5, 3, 8, dtype=torch.float64), torch.arange(5) * 11
    order = hf_permute(torch.arange(8.0).view(8, 1), 1).view(-1).long()
    # the model's angles are float32 (rope_cos_sin), Meta's here float64: float32 tolerance
    torch.testing.assert_close(ex.meta_rope(x, pos, 500000.0)[..., order],
                               ex.hf_rope(x[..., order], pos, 500000.0), rtol=1e-5, atol=1e-5)


def test_initial_loss_runs_one_step():
    judged(ex.check_initial_loss, math.log(512), math.log(256))     # bytes, not the model's vocab


def _kv_bytes(m, positions, dtype_bytes=4):
    """The chapter's count: K and V of every layer and KV head, per position."""
    return 2 * m.n_layers * m.n_kv_heads * m.head_dim * positions * dtype_bytes


def test_kv_cache_bytes_is_what_generate_leaves(fresh_attempts):
    m, (p, n) = ex.KV_MODEL, (12, 5)
    right = _kv_bytes(m, p + n - 1)          # the last token picked is never run
    judged(ex.check_kv_cache_bytes, right,
           Wrong(_kv_bytes(m, p + n), "never run through the model"),
           Wrong(right * m.n_heads // m.n_kv_heads, "KV heads"),
           Wrong(_kv_bytes(m, p + n - 1, 2), "float32"),
           Wrong(right // (p + n - 1), "one position's"))
    assert ex.check_kv_cache_bytes(f"{right / 1024:g} KiB")           # a unit is read
    assert ex.check_kv_cache_bytes(_kv_bytes(m, 20 + 3 - 1), prompt_len=20, new_tokens=3)
    shown = ex.check_kv_cache_bytes(None, reveal=True)
    assert shown.ok is None and f"{right:,} B" in shown.message


def _tp_placements():
    grid = ProcessGrid(tp=2, rank=torch.distributed.get_rank()).init_groups()
    model = apply_tensor_parallel(Transformer(ModelConfig.preset("tiny"), seed=0), grid.tp)
    return {name: placements(p)["tp"] for name, p in model.named_parameters()}


def test_figure_splits_are_the_parallelized_models():
    placed = run_local(_tp_placements, 2, backend="gloo")[0]
    for name, how in placed.items():
        key = next(k for k in TP_DIM if f"{k}." in name or name.startswith(k))
        assert how == (Replicate() if TP_DIM[key] is None else Shard(TP_DIM[key])), name
