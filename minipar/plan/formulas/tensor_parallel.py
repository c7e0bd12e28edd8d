"""The bytes tensor parallelism sends per step: per layer, embedding, head, loss and norms.

Chapter "Tensor parallelism". Torch-free, like every file of `minipar.plan.formulas`.
"""
from __future__ import annotations

import math

from ..config import ModelConfig
from .collectives import wire_bytes


def _tp_sum_bytes(size: int, tp: int, sp: bool) -> int:
    """Summing a tensor of `size` bytes over the TP ranks: an all-reduce, or under sequence
    parallelism a reduce-scatter and an all-gather of the same tensor (the same bytes)."""
    if sp:
        return wire_bytes("reduce_scatter", tp, size) + wire_bytes("all_gather", tp, size)
    return wire_bytes("all_reduce", tp, size)


def tp_layer_bytes(tokens: int, dim: int, tp: int, act_bytes: int, recompute: str = "none",
                   sp: bool = False) -> int:
    """Tensor-parallel bytes of one transformer layer for one micro-batch of `tokens` tokens.

    Megatron's layout: column-parallel in (q, k, v; gate, up), row-parallel out (o; down).
    Forward: an all-reduce of the [tokens, dim] output after o and after down (g).
    Backward: an all-reduce of the input gradient before q, k, v and before gate, up (f).
    So 4 all-reduces of tokens * dim elements. Sequence parallelism replaces each all-reduce
    by an all-gather plus a reduce-scatter of the same tensor: the same bytes.
    Full recomputation runs the forward again: 2 more.
    """
    n_ops = 4 + (2 if recompute == "full" else 0)
    return n_ops * _tp_sum_bytes(tokens * dim * act_bytes, tp, sp)


def tp_embedding_bytes(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool = False) -> int:
    """The vocab-parallel embedding (first stage): each rank looks up the tokens in its slice
    of the vocabulary (zeros elsewhere), and the [tokens, dim] results are summed: one
    all-reduce forward (g), nothing backward. With sequence parallelism the sum is a
    reduce-scatter, whose backward all-gathers the gradient (every rank's slice of the table
    needs all tokens' gradients): the same bytes either way."""
    return _tp_sum_bytes(tokens * dim * act_bytes, tp, sp)


def tp_head_bytes(tokens: int, dim: int, tp: int, act_bytes: int, sp: bool = False) -> int:
    """The column-parallel output head (last stage): its input is copied to every rank, so
    the backward all-reduces the input gradient (f). With sequence parallelism: all-gather
    forward + reduce-scatter backward, the same bytes."""
    return _tp_sum_bytes(tokens * dim * act_bytes, tp, sp)


def tp_norm_bytes(layers: int, last: bool, dim: int, tp: int, grad_bytes: int,
                  shards: int = 1) -> int:
    """Sequence parallelism only: each rank's RMSNorm sees only its slice of the tokens, so
    the gradient of a (replicated) norm weight is a partial sum: two norms per layer, plus
    the final one on the last stage. Summed over TP once per *step*, in one all-reduce,
    after the micro-batches and the data-parallel reduction (sums commute). Under ZeRO the
    rank holds one piece of each gradient, of ceil(dim / shards) elements (shards: the
    dp x cp group's size; rank 0's piece, the largest): only the piece is summed."""
    n_norms = 2 * layers + (1 if last else 0)
    return wire_bytes("all_reduce", tp, n_norms * math.ceil(dim / shards) * grad_bytes)


def collective_matmul_bytes(size: int, tp: int) -> int:
    """`--tp-overlap`: an all-gather (or reduce-scatter) of a `size`-byte tensor done as
    tp-1 ring steps, each sending one chunk of size/tp: the collective's own bytes."""
    return (tp - 1) * (size // tp) if tp > 1 else 0


def tp_cross_entropy_bytes(tokens: int, tp: int) -> int:
    """The vocab-parallel cross-entropy (last stage) never gathers the logits: three
    all-reduces of one float32 per token, the max logit (for a stable exp), the sum of
    exponentials and the target's logit (which lives on one rank only)."""
    return 3 * wire_bytes("all_reduce", tp, tokens * 4)


def tp_wire_bytes_breakdown(cfg: ModelConfig, b: int, s: int, t: int, sp: bool = False,
                            n_micro: int = 1, layers: int | None = None, first: bool = True,
                            last: bool = True, act_bytes: int = 4, param_bytes: int = 4,
                            recompute: str = "none", norm_shards: int = 1) -> dict:
    """Bytes one TP rank sends per step, by source, under the ring algorithm.

    b sequences per micro-batch, s tokens of each that this rank's TP group sees (seq_len /
    cp), t = TP degree, `layers` blocks held (default: all), first/last pipeline stage.
    With A = b s h act_bytes, one all-reduce of A sends 2 (t-1)/t A, one all-gather or
    reduce-scatter (t-1)/t A. Per micro-batch:

      layers     4 all-reduces per block (f, g for attention and for the MLP, forward and
                 backward): 8 (t-1)/t A each.  SP: 4 all-gathers + 4 reduce-scatters, the same.
      embedding  g forward: 2 (t-1)/t A.  SP: reduce-scatter forward, all-gather backward.
      head       f backward: 2 (t-1)/t A.  SP: all-gather forward, reduce-scatter backward.
      loss       3 all-reduces of b s float32 numbers: 6 (t-1)/t b s 4.
      norms      SP only, once per step (not per micro-batch): the partial gradients of
                 the norm weights (2 per block, the final norm) in one all-reduce,
                 2 (t-1)/t h param_bytes each (`norm_shards`: ZeRO's pieces).
    `--tp-overlap` sends the same bytes (`collective_matmul_bytes`), as p2p ring steps.
    """
    layers = cfg.n_layers if layers is None else layers
    tokens, h = b * s, cfg.dim
    per_micro = {
        "layers": layers * tp_layer_bytes(tokens, h, t, act_bytes, recompute, sp),
        "embedding": tp_embedding_bytes(tokens, h, t, act_bytes, sp) if first else 0,
        "head": tp_head_bytes(tokens, h, t, act_bytes, sp) if last else 0,
        "loss": tp_cross_entropy_bytes(tokens, t) if last else 0,
    }
    per_step = {k: n_micro * v for k, v in per_micro.items()}
    per_step["norms"] = tp_norm_bytes(layers, last, h, t, param_bytes, norm_shards) if sp else 0
    return per_step


def tp_wire_bytes_per_step(cfg: ModelConfig, b: int, s: int, t: int, sp: bool = False,
                           n_micro: int = 1, **kw) -> int:
    """Total of `tp_wire_bytes_breakdown`: what CommLog measures under "tp" in one step."""
    return sum(tp_wire_bytes_breakdown(cfg, b, s, t, sp, n_micro, **kw).values())
