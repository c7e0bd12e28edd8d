"""How long one GPU computes one micro-batch: matmuls by a roofline, the rest by bytes.

Chapter "Four dimensions at once" (where each axis's share of the step comes from). Three
kinds of kernels make up a transformer layer, and each has its own physics:

* matmuls: 2 m n k FLOPs on (m k + k n + m n) elements. Their time is the *smooth roofline*
  F / (e P) + B / W: compute at the fraction e of the peak P that large GEMMs reach, plus
  the operands' trip through HBM (bandwidth W). For a wide GEMM (arithmetic intensity
  F / B in the thousands) the second term is a few percent; for a thin one (a small
  micro-batch, a narrow TP shard) it is not, and the matmul runs below peak. That is what
  makes TP8 of a 2,048-wide model slower per FLOP than TP8 of a 16,384-wide one.
* the attention core (flash attention): its own kernel, whose efficiency rises with the
  length of the sequence block it works on: e_att s / (s + s_half).
* memory-bound kernels (RMSNorm, RoPE, SwiGLU's product, residual adds, casts): no
  matmul, so only the bytes they read and write count, at HBM bandwidth.

The FLOPs are those of `minipar.flops` (6 N + 12 L h s per token, PaLM), cut into GEMMs of
the shapes one TP rank runs; a causal kernel computes half of the s x s square.
"""
from __future__ import annotations

from ..config import ModelConfig
from .constants import ATTENTION_HALF_SEQ, CAUSAL_FRACTION, MEMORY_BOUND_EFFICIENCY
from .hardware import Cluster


def matmul_seconds(m: float, n: float, k: float, cluster: Cluster, efficiency: float,
                   dtype_bytes: int = 2) -> float:
    """One GEMM [m, k] x [k, n] on one GPU: the smooth roofline F / (e P) + B / W."""
    flops = 2.0 * m * n * k
    nbytes = dtype_bytes * (m * k + k * n + m * n)
    return flops / (efficiency * cluster.peak_flops) + nbytes / cluster.hbm_Bps


def linear_seconds(tokens: float, d_in: float, d_out: float, cluster: Cluster,
                   efficiency: float) -> tuple[float, float]:
    """(forward, backward) of one linear layer on `tokens` tokens: the forward GEMM, and
    the backward's two: input gradient [T, out] x [out, in] and weight gradient
    [in, T] x [T, out]. Same FLOPs each, different shapes."""
    forward = matmul_seconds(tokens, d_out, d_in, cluster, efficiency)
    backward = (matmul_seconds(tokens, d_in, d_out, cluster, efficiency)
                + matmul_seconds(d_in, d_out, tokens, cluster, efficiency))
    return forward, backward


def layer_linears(model: ModelConfig, tp: int) -> dict[str, tuple[float, float]]:
    """The (d_in, d_out) of each linear of a block as one of `tp` ranks holds it (Megatron:
    q, k, v and gate, up split by columns; o and down by rows)."""
    h, kv, f = model.dim, model.n_kv_heads * model.head_dim, model.ffn_dim
    return {"qkv": (h, (h + 2 * kv) / tp), "o": (h / tp, h),
            "gate_up": (h, 2 * f / tp), "down": (f / tp, h)}


def layer_params(model: ModelConfig, tp: int) -> float:
    """Weights of one block's linears as one of `tp` ranks holds them."""
    return sum(d_in * d_out for d_in, d_out in layer_linears(model, tp).values())


def layer_matmul_seconds(model: ModelConfig, tokens: float, tp: int, cluster: Cluster,
                         efficiency: float) -> dict[str, tuple[float, float]]:
    """{linear: (forward, backward) seconds} of one block's weight matmuls, one micro-batch."""
    return {name: linear_seconds(tokens, d_in, d_out, cluster, efficiency)
            for name, (d_in, d_out) in layer_linears(model, tp).items()}


def attention_efficiency(block_len: float, peak_fraction: float) -> float:
    """Flash attention's fraction of peak on a sequence block of `block_len` tokens: it
    rises toward `peak_fraction` as the block grows (fewer, fuller tiles per launch)."""
    return peak_fraction * block_len / (block_len + ATTENTION_HALF_SEQ)


def attention_seconds(model: ModelConfig, tokens: float, seq_len: int, cp: int, tp: int,
                      cluster: Cluster, peak_fraction: float) -> float:
    """Forward + backward of the attention core for `tokens` of this rank's queries, each
    seeing on average half of the sequence (causal): 12 h s / 2 FLOPs per token and layer,
    over tp (heads) and run at `attention_efficiency` of the rank's block s / cp."""
    flops = CAUSAL_FRACTION * 12.0 * model.n_heads * model.head_dim * seq_len * tokens / tp
    eff = attention_efficiency(seq_len / cp, peak_fraction)
    return flops / (eff * cluster.peak_flops)


def elementwise_bytes_per_token(model: ModelConfig, tp: int, sp: bool, act_bytes: int = 2) -> float:
    """HBM bytes per token and layer of the forward's memory-bound kernels: two RMSNorms
    (read x, write), two residual adds (read two, write one), RoPE on q and k, SwiGLU's
    silu(gate) * up (read two, write one). Norms and adds work on the full width unless
    sequence parallelism splits the tokens over TP."""
    h, kv, f = model.dim, model.n_kv_heads * model.head_dim, model.ffn_dim
    sp_t = tp if sp else 1
    per_token = (2 * 2 * h + 2 * 3 * h) / sp_t + 2 * (h + kv) / tp + 3 * f / tp
    return per_token * act_bytes


def elementwise_seconds(model: ModelConfig, tokens: float, tp: int, sp: bool,
                        cluster: Cluster) -> float:
    """Forward + backward (about twice the forward's traffic) of one layer's memory-bound
    kernels, at `MEMORY_BOUND_EFFICIENCY` of HBM bandwidth."""
    nbytes = 3 * elementwise_bytes_per_token(model, tp, sp) * tokens
    return nbytes / (MEMORY_BOUND_EFFICIENCY * cluster.hbm_Bps)


def optimizer_seconds(params: float, cluster: Cluster) -> float:
    """Adam on `params` parameters: memory-bound, reading fp32 weight, gradient, m and v
    and writing weight, m, v and the bf16 copy: about 30 bytes per parameter."""
    return 30.0 * params / (MEMORY_BOUND_EFFICIENCY * cluster.hbm_Bps)
