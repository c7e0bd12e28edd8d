"""The numbers the hf chapter states (book/hf.md), computed once: what Llama 3 405B's
weights weigh and what one rank of Table 4's layout reads, and the KV cache of generation
(`formulas.param_count`; the model's shape from `ModelConfig.preset`)."""
from __future__ import annotations

from pathlib import Path

from ...plan.config import ModelConfig
from ...plan.flops import param_count
from .core import Number, derived

CORPUS = Path(__file__).resolve().parents[3] / "data" / "minipar_book.txt"
BF16 = 2


def kv_bytes_per_token(m: ModelConfig, tp: int = 1, dtype_bytes: int = BF16) -> float:
    """K and V of every layer for one token, on one of `tp` GPUs (KV heads split over TP)."""
    return 2 * m.n_layers * (m.n_kv_heads / tp) * m.head_dim * dtype_bytes


def kv_cache_tokens(m: ModelConfig, tp: int, hbm_bytes: float) -> float:
    """Tokens whose KV cache fits in one GPU's memory after its bf16 TP shard of the weights."""
    free = hbm_bytes - BF16 * param_count(m) / tp
    return free / kv_bytes_per_token(m, tp)


def numbers() -> dict[str, Number]:
    m = ModelConfig.preset("llama3-405b")
    weights = BF16 * param_count(m)
    long_seq = 128 * 1024
    per_token = kv_bytes_per_token(m)
    return {
        "weights_GB": derived(weights / 1e9, "{:.0f} GB", source="2 bytes x 405.9e9"),
        "head_dim": derived(m.head_dim, source="16,384 / 128 heads"),
        "kv_per_token": derived(int(per_token / BF16), source="2 L h_kv d numbers"),
        "kv_token_MB": derived(per_token / 1e6, "{:.1f} MB", source="in bf16"),
        "long_seq": Number(long_seq // 1024, "{}K"),
        "kv_long_GB": derived(per_token * long_seq / 1e9, "{:.0f} GB", source="x 128K tokens"),
        "gqa_ratio": derived(m.n_heads // m.n_kv_heads, source="128 query heads / 8 KV heads"),
        "corpus_KB": Number(CORPUS.stat().st_size / 1e3, "{:.0f} KB", source=CORPUS.name),
    }
