"""The single-device reference: a Llama-style decoder in one screen of PyTorch.

Chapter "One model, sixteen thousand GPUs".

Every parallel layout in minipar is proved against this model. Module names are Hugging
Face's (`embed_tokens`, `layers.3.self_attn.q_proj`, ...) so that a Llama checkpoint loads
with a prefix and nothing else (`hf.hf_name`, chapter "Real models in and out"), and a
pipeline stage is just this class holding fewer layers. With `moe_experts` > 0 the MLP of
the layers from `moe_first_layer` on is a mixture of experts (`MoE`; chapter "Experts: the
fifth axis"), named as DeepSeek-V3's (`mlp.gate`, `mlp.experts`, `mlp.shared_experts`).
"""

import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..plan.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in float32 (as Hugging Face does) so bf16 runs keep the same statistics
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def llama3_scaled(inv_freq, factor, low_freq_factor, high_freq_factor, original_max_len):
    """Llama 3.1's long-context RoPE: frequencies whose wavelength is longer than
    original_max_len / low_freq_factor turn `factor` times slower (so that far positions look
    like trained ones), those shorter than original_max_len / high_freq_factor are kept,
    and a linear ramp joins the two."""
    wavelength = 2 * math.pi / inv_freq
    ramp = ((original_max_len / wavelength - low_freq_factor)
            / (high_freq_factor - low_freq_factor)).clamp(0, 1)
    return (1 - ramp) * inv_freq / factor + ramp * inv_freq


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, llama3=None):
    """cos and sin of the rotary angles for each position: [s, head_dim] each.

    Positions are explicit so that context parallelism can hand a rank the positions of the
    chunks it holds, which are not contiguous. `llama3`: `ModelConfig.llama3_rope`.
    """
    # on the positions' device: a GPU run's positions live on the GPU
    pairs = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device)
    inv_freq = 1.0 / theta ** (pairs / head_dim)
    if llama3 is not None:
        inv_freq = llama3_scaled(inv_freq, *llama3)
    # one angle per pair (i, i + d/2): the d/2 frequencies, twice
    angles = (positions.float()[:, None] * inv_freq[None, :]).repeat(1, 2)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate pairs (i, i + d/2) of each head by its position's angle. x: [b, s, heads, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :].to(x.dtype) + rotated * sin[:, None, :].to(x.dtype)


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(d) + causal mask) v for q [b, s, hq, d] and k, v [b, s, hkv, d].

    Grouped-query attention: each group of hq/hkv query heads shares one K/V head. Context
    parallelism replaces this function on each layer (`Attention.core`) and nothing else.
    """
    # enable_gqa: the kernel indexes the shared K/V head instead of copying it per query head
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), is_causal=True, enable_gqa=True)
    return out.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.core = causal_attention

    def qkv(self, x):
        """The three projections of x. A seam, like `core`: `--tp-overlap` computes all
        three in one trip round the tensor-parallel ring (`parallel/collective_matmul.py`)."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x, cos, sin):
        # [b, s, heads * d] -> [b, s, heads, d]; under tensor parallelism a rank holds
        # only its share of the heads, so their number is read from the projection
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in self.qkv(x))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(self.core(q, k, v).flatten(-2))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, ffn_dim: int | None = None):
        super().__init__()
        ffn_dim = ffn_dim or cfg.ffn_dim
        self.gate_proj = nn.Linear(cfg.dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, cfg.dim, bias=False)

    def gate_up(self, x):
        """The two projections of x (a seam: `--tp-overlap` computes both in one ring trip)."""
        return self.gate_proj(x), self.up_proj(x)

    def forward(self, x):
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)


class Experts(nn.Module):
    """E SwiGLU experts, their weights stacked: expert e is gate_proj[e], up_proj[e] and
    down_proj[e], each laid out as an nn.Linear's [out, in]. `forward(x, counts)`: the rows
    of x are token copies grouped by expert, counts[e] of them for expert e, in that order.

    A loop over the experts, not `torch._grouped_mm` (one kernel for all of them): on the CPU
    the two measured within noise of each other at this book's sizes and at 16 experts of
    512 x 1024 (benchmarks/experts_grouped.py prints loop / grouped), and the loop runs in any
    dtype, shape and device, where the grouped GEMM wants 16-byte-aligned strides, bf16 on a
    GPU, and its CPU backward fails on a broadcast gradient."""

    def __init__(self, n: int, dim: int, ffn_dim: int):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(n, ffn_dim, dim))
        self.up_proj = nn.Parameter(torch.empty(n, ffn_dim, dim))
        self.down_proj = nn.Parameter(torch.empty(n, dim, ffn_dim))

    def forward(self, x, counts):
        # unbind, not [e]: its backward stacks the experts' gradients once, where indexing
        # would write each into a zero tensor the size of all of them
        out = [F.linear(F.silu(F.linear(xe, gate)) * F.linear(xe, up), down) for xe, gate, up, down
               in zip(x.split(counts.tolist()), self.gate_proj.unbind(), self.up_proj.unbind(),
                      self.down_proj.unbind())]
        return torch.cat(out)


class _Balance(torch.autograd.Function):
    """Identity on the block's output; its backward hands the auxiliary loss its gradient, 1
    (the loss joins the objective without joining the returned logits, as Megatron's
    MoEAuxLossAutoScaler does), and counts the micro-batch's routing into the load. Counted
    in the backward because the backward runs once per micro-batch: a recomputed forward
    (`--recompute full`) routes the same tokens twice."""

    @staticmethod
    def forward(ctx, y, aux, hits, moe):
        ctx.hits, ctx.moe = hits, moe
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        ctx.moe.load += ctx.hits
        return g, torch.ones((), device=g.device), None, None


class MoE(nn.Module):
    """Mixture of experts: a router sends each token to k of E routed experts and adds up
    their outputs, weighted by its scores; shared experts see every token.

    Scores: softmax (Mixtral) or sigmoid (DeepSeek-V3), the chosen k renormalised to sum to
    1. `expert_bias` (DeepSeek-V3's auxiliary-loss-free balancing) is added to the scores
    for choosing only: `parallel/experts.balance_experts` moves it after each optimizer step,
    up for experts that received fewer than the mean, down for the others. `aux_weight` > 0
    adds the sequence-wise balance loss: per sequence, E/(k T) x sum over experts of (copies
    sent to it) x (its mean normalised score). A capacity factor C > 0 keeps, per sequence
    and expert, the ceil(C T k / E) earliest copies (position order) and drops the rest.

    `experts` is the seam of expert parallelism (`parallel/experts.py`), as `core` is
    attention's: it takes the copies grouped by expert and returns their outputs.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.k, self.n, self.sigmoid = cfg.moe_top_k, cfg.moe_experts, cfg.moe_score == "sigmoid"
        self.capacity = cfg.moe_capacity_factor
        self.gate = nn.Linear(cfg.dim, cfg.moe_experts, bias=False)     # the router
        self.register_buffer("expert_bias", torch.zeros(cfg.moe_experts))
        # copies routed to each expert since the last optimizer step (`balance_experts`)
        self.register_buffer("load", torch.zeros(cfg.moe_experts, dtype=torch.long),
                             persistent=False)
        self.experts = Experts(cfg.moe_experts, cfg.dim, cfg.expert_ffn_dim)
        shared = cfg.moe_shared_experts * cfg.expert_ffn_dim    # S experts side by side: one MLP
        self.shared_experts = MLP(cfg, shared) if shared else None
        self.aux_weight = 0.0    # the balance loss's coefficient / sequences per step (`Trainer`)

    def route(self, x):
        """x [b, s, d] -> scores [b, s, E] (float32), chosen experts and their weights [b, s, k]."""
        logits = self.gate(x).float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(-1)
        chosen = (scores + self.expert_bias).topk(self.k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        return scores, chosen, weights / weights.sum(-1, keepdim=True)

    def forward(self, x):
        scores, chosen, weights = self.route(x)
        hits = F.one_hot(chosen, self.n).sum(2)      # [b, s, E]: 1 where a token chose e
        keep = torch.ones_like(chosen, dtype=torch.bool)
        if self.capacity > 0:     # copies sent to e at earlier positions of the same sequence
            cap = math.ceil(self.capacity * x.shape[1] * self.k / self.n)
            keep = (hits.cumsum(1) - hits).gather(-1, chosen) < cap
        y = self.routed(x.flatten(0, 1), chosen.flatten(0, 1), weights.flatten(0, 1),
                        keep.flatten(0, 1)).view_as(x)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        aux = self.aux_weight * self.balance_loss(scores, hits) if self.aux_weight else \
            x.new_zeros(())
        return _Balance.apply(y, aux, hits.sum((0, 1)), self) if y.requires_grad else y

    def routed(self, x, chosen, weights, keep):
        """sum over the kept (token, slot) copies of weight x expert(token): each copy
        grouped by expert (stable: in token order), computed, added back to its token."""
        token, slot = keep.nonzero(as_tuple=True)
        expert = chosen[token, slot]
        order = expert.argsort(stable=True)
        out = self.experts(x[token[order]], torch.bincount(expert, minlength=self.n))
        w = weights[token[order], slot[order]].unsqueeze(-1).to(out.dtype)
        return x.new_zeros(x.shape, dtype=out.dtype).index_add(0, token[order], out * w)

    def balance_loss(self, scores, hits):
        """Sum over sequences of sum_e f_e P_e: f_e = E/(k T) x copies sent to e, P_e = the
        mean over the T tokens of e's score normalised over all E."""
        count = hits.sum(1).float()                                  # [b, E]
        p = (scores / scores.sum(-1, keepdim=True)).sum(1)           # [b, E]
        tokens = count.sum(-1, keepdim=True) / self.k
        return ((self.n * count / (self.k * tokens)) * (p / tokens)).sum()


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        # from moe_first_layer on, a mixture of experts (DeepSeek-V3's first 3 stay dense)
        self.mlp = MoE(cfg) if cfg.is_moe and layer >= cfg.moe_first_layer else MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """tokens [b, s] -> logits [b, s, vocab].

    `layers` is a ModuleDict keyed by the global layer index, so a pipeline stage built with
    `layer_ids=range(4, 8)` names its weights exactly as the full model does. The first stage
    alone has `embed_tokens`, the last alone `norm` and `lm_head`; a middle stage takes and
    returns hidden states.
    """

    def __init__(self, cfg: ModelConfig, layer_ids=None, first: bool = True, last: bool = True,
                 seed: int | None = 0):
        super().__init__()
        self.cfg = cfg
        layer_ids = range(cfg.n_layers) if layer_ids is None else layer_ids
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim) if first else None
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in layer_ids})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps) if last else None
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False) if last else None
        if cfg.tie_embeddings and first and last:
            self.lm_head.weight = self.embed_tokens.weight
        if seed is not None:
            init_weights(self, seed)

    def forward(self, x, positions=None):
        """`positions` of x's tokens: 0..s-1 unless given (context parallelism holds other
        chunks of the sequence; generation with a KV cache feeds the newest tokens only)."""
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        if positions is None:
            positions = torch.arange(h.shape[1], device=h.device)
        cos, sin = rope_cos_sin(positions.to(h.device), self.cfg.head_dim, self.cfg.rope_theta,
                                self.cfg.llama3_rope)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return h if self.lm_head is None else self.lm_head(self.norm(h))


def param_seed(seed: int, name: str) -> int:
    """A seed per parameter name: weights do not depend on which rank builds which layers."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@torch.no_grad()
def init_weights(model: Transformer, seed: int, std: float = 0.02):
    """Seeded, layout-independent init: N(0, std), residual outputs scaled by 1/sqrt(2L)
    (GPT-2's rule, so the residual stream's variance does not grow with depth). Norms keep
    the 1 that `RMSNorm` starts with (this runs once, in the constructor)."""
    out_std = std / math.sqrt(2 * model.cfg.n_layers)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            continue
        # a tied head on the last pipeline stage starts as a copy of the first stage's embedding
        key = name.replace("lm_head", "embed_tokens") if model.cfg.tie_embeddings else name
        g = torch.Generator().manual_seed(param_seed(seed, key))
        s = out_std if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")) else std
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * s)


def cross_entropy_sum(logits, targets):
    """Sum (not mean) of token losses: the caller divides by the global token count, so that
    every layout, however it splits the batch, computes the same average."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           reduction="sum")
