"""The hf chapter's explorer: a model's shape and a tp x pp layout -> which slice of every
weight each rank reads from the files (`figures.hf.plot_slices`) and how many bytes."""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...plan.config import ModelConfig
from ...plan.flops import local_param_count
from ...plan.flops import param_count
from ...plan.schedules import split_layers
from ..figures.hf import plot_slices
from ..style import PAGE_WIDTH
from ..widgets import choice, explorer

DEFAULTS = dict(tp=2, pp=2, layers=4, dim=128, heads=4, kv_heads=2, ffn=384, vocab=512)


def rank_bytes(tp, pp, layers, dim, heads, kv_heads, ffn, vocab, dtype_bytes=2) -> list[int]:
    """Bytes each pipeline stage's TP rank reads (bf16 by default), first stage first."""
    m = ModelConfig(n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads,
                    ffn_dim=ffn, vocab_size=vocab, tie_embeddings=False)
    return [dtype_bytes * local_param_count(m, tp, len(s), i == 0, i == pp - 1)
            for i, s in enumerate(split_layers(layers, pp))]


def figure(tp=2, pp=2, layers=4, dim=128, heads=4, kv_heads=2, ffn=384, vocab=512):
    """The slices of one layer per TP rank, and each stage's bytes read against the model's."""
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 4.6),     # the slices, the bytes below
                                 gridspec_kw={"height_ratios": [2, 1]})
    plot_slices(tp, pp, layers, dim, heads, kv_heads, ffn, vocab, ax=ax)
    per = rank_bytes(tp, pp, layers, dim, heads, kv_heads, ffn, vocab)
    whole = 2 * param_count(ModelConfig(n_layers=layers, dim=dim, n_heads=heads,
                                        n_kv_heads=kv_heads, ffn_dim=ffn, vocab_size=vocab,
                                        tie_embeddings=False))
    bx.bar([f"stage {i}" for i in range(pp)], [b / whole for b in per], color="#4C72B0")
    bx.set_ylim(0, 1)
    bx.set_ylabel("share of the model's\nbytes one rank reads", fontsize=8)
    bx.set_title(f"{tp * pp} ranks, bf16, untied", fontsize=8)
    bx.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


CONTROLS = {"tp": choice([1, 2, 4]), "pp": choice([1, 2, 4]), "layers": choice([4, 8, 16]),
            "dim": choice([64, 128, 256]), "heads": choice([4, 8]), "kv_heads": choice([1, 2, 4]),
            "ffn": choice([256, 384, 512]), "vocab": choice([256, 512, 1024])}


# The settings the HTML book offers (teach/web.py draws each ahead of time): every TP and PP
# together; every value of the model's shapes one at a time.
WEB = {"tp": [1, 2, 4], "pp": [1, 2, 4]}
ALONE = {name: list(CONTROLS[name].values)
         for name in ("layers", "dim", "heads", "kv_heads", "ffn", "vocab")}


def explore(**defaults):
    """Dropdowns over `figure`."""
    return explorer(CONTROLS, figure, {**DEFAULTS, **defaults}, split=4)
