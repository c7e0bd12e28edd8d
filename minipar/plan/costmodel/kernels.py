"""How long one GPU computes one micro-batch: each kernel by its measured speed.

Chapter "Four dimensions at once" (where each axis's share of the step comes from). Three
kinds of kernels make up a transformer layer, and each has its own physics, measured on a
Hopper GPU by `benchmarks/kernels/measure.py` (`constants`):

* matmuls: 2 m n k FLOPs. Every GEMM shape of the published runs was timed; another shape
  follows the kernel curve fitted to that sweep, F / (e P) + B / (w W) + t0: compute at a
  fraction e of the peak P, the operands' traffic, a fixed cost per launch. A thin GEMM (a
  small micro-batch, a narrow TP shard) runs far below peak: that is what makes TP8 of a
  2,048-wide model slower per FLOP than TP8 of a 16,384-wide one.
* the attention core: its own kernel (FlashAttention-2 or cuDNN's), whose speed rises with
  the length of the sequence block it works on, as measured.
* memory-bound kernels (RMSNorm, RoPE, SwiGLU's product, residual adds, casts, the loss over
  the vocabulary): no matmul, so only the bytes they move count, at the stream bandwidth
  of HBM, times what the software stack's kernels really move (`elementwise_factor`).

The FLOPs are those of `minipar.plan.flops` (6 N + 12 L h s per token, PaLM), cut into GEMMs of
the shapes one TP rank runs; a causal kernel computes half of the s x s square. Measured on
an H200 (an H100's compute, faster memory): compute scales by the peak, memory-bound work
by the target's HBM bandwidth.
"""
from __future__ import annotations

import functools

from ..config import ModelConfig
from .constants import (CAUSAL_FRACTION, FUSED_ELEMENTWISE, MEASURED_HBM_TBps,
                        MEASURED_PEAK_TFLOPS, attention_tflops, cp_attention_tflops, gemm_curve,
                        gemm_table, measurements, median, stream_fraction)
from .hardware import Cluster


@functools.cache
def cross_entropy_s_per_logit(kind: str) -> float:
    """Seconds per logit of the loss, measured on the H200: "fused", or "eager" (fp32, op by op)."""
    return median([r[f"{kind}_s"] / (r["tokens"] * r["vocab"]) for r in measurements()["cross_entropy"]])


def matmul_seconds(m: float, n: float, k: float, cluster: Cluster, dtype_bytes: int = 2) -> float:
    """One bf16 GEMM [m, k] x [k, n] on one GPU: measured if the shape was, else the curve."""
    scale = MEASURED_PEAK_TFLOPS / cluster.peak_tflops
    shape = (round(m), round(n), round(k))
    if shape in gemm_table() and dtype_bytes == 2:
        return gemm_table()[shape] * scale
    e, w, t0 = gemm_curve()
    nbytes = dtype_bytes * (m * k + k * n + m * n)
    return 2.0 * m * n * k / (e * cluster.peak_flops) + nbytes / (w * cluster.hbm_Bps) + t0


def linear_seconds(tokens: float, d_in: float, d_out: float, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) of one linear layer on `tokens` tokens: the forward GEMM, and
    the backward's two: input gradient [T, out] x [out, in] and weight gradient
    [in, T] x [T, out]. Same FLOPs each, different shapes."""
    forward = matmul_seconds(tokens, d_out, d_in, cluster)
    backward = (matmul_seconds(tokens, d_in, d_out, cluster)
                + matmul_seconds(d_in, d_out, tokens, cluster))
    return forward, backward


def layer_linears(model: ModelConfig, tp: int) -> dict[str, tuple[float, float]]:
    """The (d_in, d_out) of each linear of a block as one of `tp` ranks holds it (Megatron:
    q, k, v and gate, up split by columns; o and down by rows). A two-matrix MLP's "gate_up"
    is its up projection alone."""
    h, kv, f = model.dim, model.n_kv_heads * model.head_dim, model.ffn_dim
    return {"qkv": (h, (h + 2 * kv) / tp), "o": (h / tp, h),
            "gate_up": (h, (model.mlp_matrices - 1) * f / tp), "down": (f / tp, h)}


def layer_params(model: ModelConfig, tp: int) -> float:
    """Weights of one block's linears as one of `tp` ranks holds them."""
    return sum(d_in * d_out for d_in, d_out in layer_linears(model, tp).values())


def layer_matmul_seconds(model: ModelConfig, tokens: float, tp: int, cluster: Cluster,
                         comm_sms=()) -> dict[str, tuple[float, float]]:
    """{linear: (forward, backward) seconds} of one block's weight matmuls, one micro-batch.
    `comm_sms` ((linear, SMs), ...): forward GEMMs that leave that many SMs to a concurrent
    collective (`Efficiency.tp_comm_sms`) run at the rest's speed."""
    out = {name: linear_seconds(tokens, d_in, d_out, cluster)
           for name, (d_in, d_out) in layer_linears(model, tp).items()}
    for name, sms in comm_sms:
        forward, backward = out[name]
        out[name] = (forward * cluster.sms / (cluster.sms - sms), backward)
    return out


def attention_seconds(model: ModelConfig, tokens: float, seq_len: int, cp: int, tp: int,
                      cluster: Cluster, kernel: str = "cudnn", cp_impl: str = "allgather") -> float:
    """Forward + backward of the attention core for `tokens` of this rank's queries, each
    seeing on average half of the sequence (causal): 12 h s / 2 FLOPs per token and layer,
    over tp (heads), at the measured speed of `kernel` on sequences of s tokens."""
    flops = CAUSAL_FRACTION * 12.0 * model.n_heads * model.head_dim * seq_len * tokens / tp
    return flops / attention_flops_per_s(kernel, seq_len, cp, cluster, cp_impl)


def attention_flops_per_s(kernel: str, seq_len: int, cp: int, cluster: Cluster,
                          cp_impl: str = "allgather") -> float:
    """What `kernel` ("flash2" or "cudnn") computes per second on sequences of seq_len
    tokens, as measured, scaled from the measuring GPU's peak to the cluster's. With CP the
    kernel depends on how the keys arrive. All-gather: the rank's query chunks meet all the
    keys before them under a lower-right causal mask, one kernel of its own, measured as
    such (`cp_attention_tflops`). Ring: each of the cp steps is a kernel call on blocks of
    s / cp tokens (Transformer Engine's `AttnFuncWithCPAndKVP2P`), timed like a sequence of
    that length. Ulysses: after its all-to-all a rank runs whole sequences, 1/cp of the
    heads."""
    name = {"flash2": "flash", "cudnn": "cudnn"}[kernel]
    if cp > 1 and cp_impl == "allgather":
        measured = cp_attention_tflops(name)
    else:
        measured = attention_tflops(name, seq_len / cp if cp_impl == "ring" else seq_len)
    return measured * 1e12 * cluster.peak_tflops / MEASURED_PEAK_TFLOPS


def elementwise_bytes_per_token(model: ModelConfig, tp: int, sp: bool, act_bytes: int = 2) -> float:
    """HBM bytes per token and layer of the forward's memory-bound kernels: two RMSNorms
    (read x, write), two residual adds (read two, write one), RoPE on q and k, SwiGLU's
    silu(gate) * up (read two, write one; a two-matrix MLP's activation reads one). Norms and
    adds work on the full width unless sequence parallelism splits the tokens over TP."""
    h, kv, f = model.dim, model.n_kv_heads * model.head_dim, model.ffn_dim
    sp_t = tp if sp else 1
    per_token = (2 * 2 * h + 2 * 3 * h) / sp_t + 2 * (h + kv) / tp + model.mlp_matrices * f / tp
    return per_token * act_bytes


def stream_seconds(nbytes: float, cluster: Cluster) -> float:
    """A memory-bound kernel moving `nbytes` through HBM at the measured stream fraction."""
    return nbytes / (stream_fraction() * cluster.hbm_Bps)


def elementwise_seconds(model: ModelConfig, tokens: float, tp: int, sp: bool,
                        cluster: Cluster, kind: str = "fused") -> float:
    """Forward + backward (about twice the forward's traffic) of one layer's memory-bound
    kernels, as the stack's `kind` of kernels ("fused" or "eager", `Efficiency.elementwise`)
    moves them (`elementwise_factor`)."""
    nbytes = elementwise_factor(kind) * 3 * elementwise_bytes_per_token(model, tp, sp) * tokens
    return stream_seconds(nbytes, cluster)


def cross_entropy_seconds(tokens: float, vocab_shard: float, cluster: Cluster, kind: str) -> float:
    """The loss over a [tokens, vocab / tp] shard of logits, forward + backward: memory-bound,
    at the measured seconds per logit of the fused or eager (fp32, op by op) loss, scaled
    from the measuring GPU's HBM to the target's."""
    return (cross_entropy_s_per_logit(kind) * tokens * vocab_shard
            * MEASURED_HBM_TBps * 1e12 / cluster.hbm_Bps)


def optimizer_seconds(params: float, cluster: Cluster) -> float:
    """Adam on `params` parameters: memory-bound, reading fp32 weight, gradient, m and v
    and writing weight, m, v and the bf16 copy: about 30 bytes per parameter."""
    return stream_seconds(30.0 * params, cluster)


# ---------------------------------------------------------------- the pointwise factor
# How many times the bytes counted above an implementation's norms, RoPE, SwiGLU and adds
# really move: whole eager PyTorch blocks were timed on the measuring GPU; what their GEMMs
# and attention do not explain, over what `elementwise_seconds` gives their pointwise bytes,
# is the factor (`elementwise_factor("eager")`). Derived with this file's own formulas, on
# the GPU the blocks ran on.
MEASURING_GPU = Cluster(name="H200 (data/kernels_h200.json)", peak_tflops=MEASURED_PEAK_TFLOPS,
                        hbm_TBps=MEASURED_HBM_TBps)


def _measured_block(spec: dict) -> ModelConfig:
    return ModelConfig(dim=spec["dim"], n_heads=spec["heads"], n_kv_heads=spec["kv"],
                       ffn_dim=spec["ffn"], max_seq_len=spec["seq"], name=spec["model"])


def pointwise_factor(blocks: list[dict], kernel: str = "flash2") -> float:
    """Median over measured blocks of (block - its matmuls - its attention) seconds over
    their pointwise kernels' seconds at factor 1."""
    gpu, out = MEASURING_GPU, []
    for spec in blocks:
        m, tokens, tp = _measured_block(spec), spec["tokens"], spec["tp"]
        matmuls = sum(f + b for f, b in layer_matmul_seconds(m, tokens, tp, gpu).values())
        attention = attention_seconds(m, tokens, spec["seq"], 1, tp, gpu, kernel)
        out.append((spec["fwd_bwd_s"] - matmuls - attention)
                   / elementwise_seconds(m, tokens, tp, False, gpu))
    return median(out)


@functools.cache
def elementwise_factor(kind: str) -> float:
    """Bytes a stack's pointwise kernels move over the bytes `elementwise_bytes_per_token`
    counts: 1 when "fused", the measured `pointwise_factor` of eager blocks when "eager"."""
    if kind == "eager":
        return pointwise_factor(measurements()["layers"])
    return {"fused": FUSED_ELEMENTWISE}[kind]
