"""The bytes context parallelism sends: K/V blocks round a ring, an all-gather, or Ulysses.

Chapter "Context parallelism". Torch-free, like every file of `minipar.plan.formulas`.
"""
from __future__ import annotations

from ..config import CP_IMPLS, ConfigError, ModelConfig, unknown
from .collectives import wire_bytes


def cp_hops(cp: int, impl: str, recompute: str = "none") -> int:
    """How many times one rank sends a K/V-block-sized message per layer and micro-batch.

    ring:      forward cp-1 K/V blocks; backward cp-1 K/V blocks again (not stored: that
               would be the whole sequence's K,V) and cp-1 dK/dV accumulators (started one
               rank downstream of their block's owner, so cp-1 hops bring them home).
    allgather: (Llama 3) all-gather of cp blocks, (cp-1)/cp of them = cp-1 blocks, kept for
               the backward; its backward, a reduce-scatter of the same size, cp-1 more.
    Full recomputation repeats the forward part. The load-balanced causal layout sends whole
    blocks even where the mask will discard half of one.
    """
    if impl not in CP_IMPLS:
        raise ConfigError(unknown("--cp-impl", impl, CP_IMPLS))
    if impl == "ulysses":
        raise ValueError("Ulysses moves q and the output too, not K/V blocks: ulysses_layer_bytes")
    if cp == 1:
        return 0
    forward, backward = cp - 1, (2 if impl == "ring" else 1) * (cp - 1)
    return forward * (2 if recompute == "full" else 1) + backward


def cp_kv_bytes(tokens: int, kv_heads: int, head_dim: int, act_bytes: int) -> int:
    """One rank's K and V for one layer: 2 tokens x kv_heads x head_dim, GQA not expanded
    (kv_heads is the rank's share: n_kv_heads / tp)."""
    return 2 * tokens * kv_heads * head_dim * act_bytes


def ulysses_kv_heads(kv_heads: int, cp: int) -> int:
    """KV heads a rank sends under Ulysses: its own, or, fewer than cp (GQA), each
    replicated to the cp/kv_heads ranks whose query heads read it: cp of them."""
    return kv_heads if kv_heads % cp == 0 else cp


def ulysses_layer_bytes(kv: int, cp: int, q_per_kv: int, recompute: str = "none") -> int:
    """DeepSpeed-Ulysses' bytes for one layer and micro-batch; `kv` = `cp_kv_bytes` of a
    rank with `ulysses_kv_heads`, q_per_kv = query heads per (sent) KV head.

    Forward: three all-to-alls, q (q_per_kv * kv/2 bytes), K and V together (kv), the
    output (as q): each sends (cp-1)/cp of its tensor. Backward: the same three, reversed.
    So 2 (cp-1)/cp (q_per_kv + 1) kv: per rank it *falls* as cp grows (each rank's tokens
    shrink), where the ring's and the all-gather's (cp-1) kv grow with cp.
    """
    if cp == 1:
        return 0
    per_pass = wire_bytes("all_to_all", cp, q_per_kv * kv // 2) * 2 + wire_bytes("all_to_all", cp, kv)
    return per_pass * (3 if recompute == "full" else 2)


def cp_layer_bytes(kv: int, cp: int, impl: str = "ring", recompute: str = "none",
                   q_per_kv: int = 1) -> int:
    """Context-parallel bytes of one layer and micro-batch; `kv` = `cp_kv_bytes` of a rank
    (q_per_kv: query heads per KV head, needed by Ulysses alone)."""
    if impl == "ulysses":
        return ulysses_layer_bytes(kv, cp, q_per_kv, recompute)
    return cp_hops(cp, impl, recompute) * kv


def cp_wire_bytes_per_step(model_cfg: ModelConfig, b: int, s: int, cp: int, impl: str = "ring",
                           n_micro: int = 1, tp: int = 1, n_layers: int | None = None,
                           dtype_bytes: int = 4, recompute: str = "none") -> int:
    """Bytes one CP rank sends per optimizer step: the formula `comm.LOG` is tested against.

    b: sequences per micro-batch on this rank, s: the full sequence length, n_layers: the
    layers this rank holds (all of them without pipeline parallelism). The K/V block of a
    rank is 2 (K and V) * b * s/cp * (n_kv_heads / tp) * head_dim elements: KV heads, not
    query heads, because GQA's K/V are sent un-expanded (Ulysses replicates them up to cp).
    """
    layers = model_cfg.n_layers if n_layers is None else n_layers
    kv_heads, q_heads = model_cfg.n_kv_heads // tp, model_cfg.n_heads // tp
    if impl == "ulysses":
        kv_heads = ulysses_kv_heads(kv_heads, cp)
    kv = cp_kv_bytes(b * (s // cp), kv_heads, model_cfg.head_dim, dtype_bytes)
    return n_micro * layers * cp_layer_bytes(kv, cp, impl, recompute, q_heads // kv_heads)
