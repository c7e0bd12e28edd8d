"""What a GPU holds: its parameters, and the activations each layer saves for the backward.

Chapter "Memory: where every byte goes". Torch-free, like every file of `minipar.plan.formulas`.
"""
from __future__ import annotations

from ..config import ModelConfig


# What minipar's eager PyTorch code saves for the backward, tensor by tensor (chapter
# "Memory: where every byte goes" derives each line from model.py; tests/test_memory.py checks
# them against `memory.ActivationMeter`). Elements per token this rank holds (b x s/cp).
def norm_saved_elements(h: int, tp: int, sp: bool) -> float:
    """RMSNorm, then the linear that reads it: its input x, rsqrt (1 per token), x * rsqrt,
    and the gained output the linear saves: 3h + 1. Under SP the norm runs on 1/tp of the
    tokens and the linear saves the all-gathered output: (2h + 1)/tp + h."""
    return (2 * h + 1) / tp + h if sp else 3 * h + 1


def attention_saved_elements(model: ModelConfig, tp: int, cp: int = 1, cp_impl: str = "ring",
                             recompute: str = "none") -> float:
    """q, k, v after RoPE; the attention output (which o_proj saves too: one storage); its
    log-sum-exp (1 per head), over tp. All-gather context parallelism keeps the K/V of the
    whole sequence (cp times the local ones). Selective recompute keeps only q, k, v and the
    output o_proj saves: 2h + 2kv; the log-sum-exp (and all-gather's K/V) are recomputed."""
    h, kv, hq = model.dim, model.n_kv_heads * model.head_dim, model.n_heads
    if recompute == "selective":
        return (2 * h + 2 * kv) / tp
    kv_kept = 2 * kv * (cp if cp > 1 and cp_impl == "allgather" else 1)
    return (2 * h + kv_kept + hq) / tp


def layer_saved_breakdown(model: ModelConfig, tp: int = 1, sp: bool = False, cp: int = 1,
                          cp_impl: str = "ring", recompute: str = "none") -> dict[str, float]:
    """One transformer block, per token, by part: the two norms, attention, and SwiGLU's
    gate, silu(gate), up and their product (4 ffn/tp). Full recompute keeps only the
    block's input."""
    if recompute == "full":
        return {"input": model.dim / tp if sp else model.dim}
    return {"norms": 2 * norm_saved_elements(model.dim, tp, sp),
            "attention": attention_saved_elements(model, tp, cp, cp_impl, recompute),
            "mlp": 4 * model.ffn_dim / tp}


def layer_saved_elements(model: ModelConfig, tp: int = 1, sp: bool = False, cp: int = 1,
                         cp_impl: str = "ring", recompute: str = "none") -> float:
    """One transformer block's saved elements per token (`layer_saved_breakdown`, summed)."""
    return sum(layer_saved_breakdown(model, tp, sp, cp, cp_impl, recompute).values())


def weight_pass_kept_elements(model: ModelConfig, tp: int = 1, sp: bool = False, cp: int = 1,
                              cp_impl: str = "ring") -> float:
    """Full recompute under zero-bubble: what W's rerun of a block keeps until the chunk's
    W ends: all the block saves but its input (already kept) and what the weight gradients
    consume (each norm's x * rsqrt and output, the down projection's input)."""
    h, sp_t = model.dim, (tp if sp else 1)
    norm_read = norm_saved_elements(h, tp, sp) - (h + 1) / sp_t
    return (layer_saved_elements(model, tp, sp, cp, cp_impl) - h / sp_t
            - 2 * norm_read - model.ffn_dim / tp)


def rope_saved_elements(model: ModelConfig, seq_local: int) -> int:
    """cos and sin, [s, head_dim] each: per micro-batch and model chunk, not per token."""
    return 2 * seq_local * model.head_dim


def embedding_saved_bytes(tokens: int, tp: int) -> int:
    """The token ids (int64); the vocab-parallel embedding adds a 1-byte mask per token."""
    return tokens * (8 + (1 if tp > 1 else 0))


def head_saved_bytes(model: ModelConfig, tokens: int, tp: int, sp: bool, act_bytes: int = 4) -> float:
    """Final norm and head input, the softmax of the logits (vocab/tp per token), the targets
    (int64; + a 1-byte mask under TP; a 0-dim loss without)."""
    acts = (norm_saved_elements(model.dim, tp, sp) + model.vocab_size / tp) * act_bytes
    return tokens * (acts + 8 + (1 if tp > 1 else 0)) + (0 if tp > 1 else act_bytes)


def activation_elements(model: ModelConfig, tp: int, sp: bool, recompute: str) -> float:
    """Elements one GPU stores per token and layer for the backward (Korthikanti et al. 2022's
    accounting, for a Llama block with flash attention: no s x s scores are stored).

      none       x, norm(x), x2, norm(x2)         4 h   (split over tp only with SP)
                 q, k, v, attention output        2 h + 2 kv_dim   (split over tp)
                 gate, up, silu(gate) * up        3 ffn            (split over tp)
      selective  recompute the norms, the attention core and the SwiGLU product:
                 x, x2 | q, k, v | gate, up
      full       only each layer's input x (plus one layer's worth while it is recomputed)
    """
    h, kv, f = model.dim, model.n_kv_heads * model.head_dim, model.ffn_dim
    sp_t = tp if sp else 1
    if recompute == "none":
        return 4 * h / sp_t + (2 * h + 2 * kv + 3 * f) / tp
    if recompute == "selective":
        return 2 * h / sp_t + (h + 2 * kv + 2 * f) / tp
    return h / sp_t
