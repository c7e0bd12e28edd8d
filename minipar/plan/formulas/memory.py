"""What a GPU holds: its share of the training state under each ZeRO stage, the
activations each layer saves for the backward, and how many micro-batches' worth of them
a pipeline schedule keeps in flight.

Chapter "Memory: where every byte goes". Torch-free, like every file of `minipar.plan.formulas`.
The memory model (`minipar.plan.memory`, which the preflight reads) takes its formulas
from this file alone. ZeRO's shards are met first in chapter "Data parallelism", the schedules in chapter
"Pipeline parallelism"; they live here because what they count is bytes held, not sent.
"""
from __future__ import annotations

from ..config import ModelConfig


# What each rank keeps of the weights, gradients and optimizer state (chapter "Data
# parallelism" draws it, `plot_zero_shards`).
def zero_shards(stage: int, n: int) -> dict[str, int]:
    """Over how many ranks ZeRO `stage` splits each part of the training state: stage 1 the
    optimizer state, stage 2 also the gradients, stage 3 also the parameters."""
    return {"params": n if stage >= 3 else 1, "grads": n if stage >= 2 else 1,
            "optimizer": n if stage >= 1 else 1}


def zero_bytes_per_param(stage: int, n: int, param: float = 2, grad: float = 2,
                         optimizer: float = 12) -> dict[str, float]:
    """Bytes per parameter one rank holds at ZeRO `stage` over n ranks (the ZeRO paper's
    2 + 2 + K, K = 12 for mixed-precision Adam: fp32 master weight, m and v)."""
    shards = zero_shards(stage, n)
    return {"params": param / shards["params"], "grads": grad / shards["grads"],
            "optimizer": optimizer / shards["optimizer"]}


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


def logits_saved_bytes(model: ModelConfig, tokens: int, tp: int, act_bytes: int = 2) -> float:
    """What a fused stack's last stage keeps for the loss's backward, per micro-batch: the
    logits (vocab/tp per token, in the activation dtype) and their softmax in fp32, which
    Megatron's vocab-parallel cross-entropy, fused or not, saves for its backward
    (`exp_logits`): 6 bytes per logit in bf16, 1.6 GB for 8,192 tokens of a 128K vocabulary
    on one GPU."""
    return tokens * model.vocab_size / tp * (act_bytes + 4)


def activation_elements(model: ModelConfig, tp: int, sp: bool, recompute: str) -> float:
    """Elements one GPU stores per token and layer for the backward (Korthikanti et al. 2022's
    accounting, for a Llama block with flash attention: no s x s scores are stored).

      none       x, norm(x), x2, norm(x2)         4 h   (split over tp only with SP)
                 q, k, v, attention output        2 h + 2 kv_dim   (split over tp)
                 gate, up, silu(gate) * up        3 ffn            (split over tp)
      selective  recompute the norms, the attention core and the SwiGLU product:
                 x, x2 | q, k, v | gate, up
      full       only each layer's input x (plus one layer's worth while it is recomputed)

    A two-matrix MLP (GeLU, squared ReLU) keeps up(x) and act(up(x)): 2 ffn, and under
    selective recompute up(x) alone.
    """
    h, kv, f = model.dim, model.n_kv_heads * model.head_dim, model.ffn_dim
    sp_t, mlp = (tp if sp else 1), model.mlp_matrices
    if recompute == "none":
        return 4 * h / sp_t + (2 * h + 2 * kv + mlp * f) / tp
    if recompute == "selective":
        return 2 * h / sp_t + (h + 2 * kv + (mlp - 1) * f) / tp
    return h / sp_t


# How many micro-batches' activations a pipeline rank holds at its peak (checked against
# the schedules themselves, `schedule_analysis.peak_in_flight`, in tests/test_schedules.py).
def in_flight_microbatches(schedule: str, pp: int, microbatches: int, stage: int = 0,
                           virtual_stages: int = 1) -> float:
    """Micro-batches whose activations pipeline rank `stage` holds at its peak, in units of
    "one micro-batch through all of the rank's layers".

    afab: all m. 1f1b and zb: the p - stage forwards before the first backward. Interleaved
    (Megatron): N (v-1) + 2 (p-1-stage) + 1 chunk-forwards in flight, N = p, over v chunks:
    p + (p-1)/v on the first rank.
    """
    m, p, v = microbatches, pp, virtual_stages
    if p == 1:
        return 1
    if schedule == "afab":
        return m
    if schedule == "interleaved" and v > 1:
        return sum(in_flight_chunks(schedule, p, m, stage, v)) / v
    if schedule == "zb":      # W waits: every rank holds up to p (ZB-H1's memory bound)
        return min(m, p)
    return min(m, p - stage)


def in_flight_chunks(schedule: str, pp: int, microbatches: int, stage: int = 0,
                     virtual_stages: int = 1, consecutive: int | None = None) -> list[int]:
    """Micro-batches in flight on each of pipeline rank `stage`'s chunks at its peak (the
    first chunk of rank 0 holds the embedding, the last chunk of the last rank the head:
    how many of *those* are in flight decides what they add). Interleaved: the warm-up's
    forwards go chunk by chunk in groups of N = `consecutive` micro-batches (default p,
    Megatron's order), so forward k belongs to chunk (k // N) mod v."""
    m, p, v = microbatches, pp, virtual_stages
    if schedule != "interleaved" or v == 1 or p == 1:
        return [int(in_flight_microbatches(schedule, p, m, stage))] * v
    n = p if consecutive is None else consecutive
    total = min(n * (v - 1) + 2 * (p - 1 - stage) + 1, m * v)
    group = min(m, n)
    return [sum(1 for k in range(total) if (k // group) % v == c) for c in range(v)]
