"""How much arithmetic a training step is, and what fraction of the hardware it used (MFU).

Chapter "One model, sixteen thousand GPUs" (the model's size and the arithmetic of its
training run); the chapter "MFU and communication volume" turns it into MFU. Torch-free: the
cost model and the book use it without a process group. A GPU's peak is its data sheet's
(`minipar.plan.datasheets`); measuring this machine's is `minipar.runtime.peak`'s job.

The convention is PaLM's (Chowdhery et al. 2022, appendix B), as Llama 3 and torchtitan use it:

    model FLOPs per token = 6 N + 12 L h s

* 6 N: every weight a token meets costs one multiply-add (2 FLOPs) in the forward pass and
  two in the backward pass (gradient w.r.t. the input and w.r.t. the weight): 2 + 4 = 6.
  N counts the weights a token is *multiplied* by: every parameter except the input
  embedding table, which is a lookup (with tied embeddings the table is the output head and
  counts once). For Llama 3 405B, N = 403.7e9 of its 405.9e9 parameters.
* 12 L h s: attention's two matmuls, QK^T and (softmax)V, each 2 h s FLOPs per token and
  layer forward (h = n_heads * head_dim, s the sequence length), times 3 for the backward.
  No discount for the causal mask: PaLM counts the full s x s square although a causal
  kernel skips half of it (Megatron-LM halves it instead, so its MFU reads lower at long s).

MFU = model FLOPs actually processed per second / peak FLOP/s. *Hardware* FLOPs add the work
done again by activation recomputation; HFU divides those by the peak instead. `mfu` and
`hfu` are the one place that division is written: the trainer's step record, the cost
model, the replay and the book call them.
"""

from .config import ModelConfig


# ------------------------------------------------------------------ parameters
def mlp_param_count(model: ModelConfig, moe: bool = False, active: bool = False) -> int:
    """Weights of one block's MLP. Dense: its matrices of ffn_dim. A mixture-of-experts block
    (chapter "Experts: the fifth axis"): the router (E scores from each token), the shared
    experts and the routed ones, all E of them, or with `active` the top_k a token meets."""
    if not moe:
        return model.mlp_matrices * model.dim * model.ffn_dim
    routed = model.moe_top_k if active else model.moe_experts
    return model.dim * model.moe_experts + (model.moe_shared_experts + routed) * expert_param_count(model)


def expert_param_count(model: ModelConfig) -> int:
    """Weights of one expert: an MLP of expert_ffn_dim."""
    return model.mlp_matrices * model.dim * model.expert_ffn_dim


def moe_layer_count(model: ModelConfig, layers: range) -> int:
    """How many of the blocks `layers` are mixture-of-experts: those from moe_first_layer on."""
    return len(range(max(layers.start, model.moe_first_layer), layers.stop)) if model.is_moe else 0


def layer_param_count(model: ModelConfig, moe: bool = False, active: bool = False) -> int:
    """Weights of one transformer block: attention, the MLP (`mlp_param_count`) and the two
    RMSNorm gains."""
    h, hd = model.dim, model.head_dim
    attention = h * model.n_heads * hd * 2 + h * model.n_kv_heads * hd * 2   # q, o; k, v
    return attention + mlp_param_count(model, moe, active) + 2 * h


def param_count(model: ModelConfig, embeddings: bool = True, active: bool = False) -> int:
    """Parameters of the model, exactly as `minipar.trainer.model.Transformer` holds them.

    embeddings=False leaves out the input embedding table (a lookup, no FLOPs) and keeps the
    output head (a matmul): that is the N of 6N. With tied embeddings the shared table is the
    head, so it stays. `active`: a mixture of experts' weights one token meets (its top_k
    routed experts of each MoE block, not all E): the N of its FLOPs.
    """
    table = model.vocab_size * model.dim
    head = 0 if model.tie_embeddings else table
    inputs = table if embeddings or model.tie_embeddings else 0
    moe = moe_layer_count(model, range(model.n_layers))
    blocks = (model.n_layers - moe) * layer_param_count(model) + moe * layer_param_count(model, True, active)
    return blocks + model.dim + head + inputs                                # + final norm


def local_param_count(model: ModelConfig, tp: int, layers: int, first: bool, last: bool,
                      moe_layers: int = 0) -> int:
    """Parameters one GPU holds: `layers` blocks sharded over tp (norm gains replicated), plus
    the vocab-parallel embedding on the first stage, the final norm and head on the last.
    `moe_layers` of those blocks are mixture-of-experts: counted here without their routed
    experts, which expert parallelism splits instead (`local_expert_param_count`)."""
    h = model.dim
    block = (layer_param_count(model) - 2 * h) // tp + 2 * h
    moe_block = (layer_param_count(model, True) - model.moe_experts * expert_param_count(model)
                 - 2 * h) // tp + 2 * h
    table = model.vocab_size * h // tp
    norm_and_head = h + (0 if model.tie_embeddings and first else table)
    blocks = (layers - moe_layers) * block + moe_layers * moe_block
    return blocks + (table if first else 0) + (norm_and_head if last else 0)


def local_expert_param_count(model: ModelConfig, tp: int, ep: int, moe_layers: int) -> int:
    """Routed-expert weights one GPU holds in its `moe_layers` blocks: E / ep experts each,
    every expert sharded over tp like a dense MLP."""
    return moe_layers * (model.moe_experts // ep) * expert_param_count(model) // tp


# ------------------------------------------------------------------ FLOPs
def dense_flops_per_token(model: ModelConfig) -> float:
    """6 N: the weight matmuls, forward and backward. For a mixture of experts N is the
    weights a token meets (`param_count(active=True)`): MFU counts the work each token needs,
    not the experts it skips."""
    return 6.0 * param_count(model, embeddings=False, active=True)


def attention_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """12 L h s: QK^T and attention-times-V, forward and backward, full square (PaLM)."""
    return 12.0 * model.n_layers * model.n_heads * model.head_dim * seq_len


def flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Model FLOPs per token of a training step: 6 N + 12 L h s (PaLM's convention)."""
    return dense_flops_per_token(model) + attention_flops_per_token(model, seq_len)


def hardware_flops_per_token(model: ModelConfig, seq_len: int, recompute: str = "none") -> float:
    """Model FLOPs plus what activation recomputation does a second time (PaLM counting): the
    numerator of HFU. Done again, per `--recompute` mode (`config.RECOMPUTE_MODES`):

    none:      nothing.
    selective: the attention core's forward (QK^T, softmax, times V): a third of 12 L h s.
    full:      the whole forward pass: 2 N + 4 L h s.
    """
    attention_forward = attention_flops_per_token(model, seq_len) / 3
    redone = {"none": 0.0, "selective": attention_forward,
              "full": dense_flops_per_token(model) / 3 + attention_forward}
    return flops_per_token(model, seq_len) + redone[recompute]


def mfu(tokens_per_s: float, model: ModelConfig, seq_len: int, peak_flops: float | None,
        n_devices: int = 1) -> float | None:
    """Model FLOPs utilisation of `n_devices` together processing `tokens_per_s` tokens per
    second, each device able to do `peak_flops` FLOP/s. None when the peak is unknown.
    (It is `hfu` without recomputation: then model and hardware FLOPs are the same.)"""
    return hfu(tokens_per_s, model, seq_len, peak_flops, n_devices)


def hfu(tokens_per_s: float, model: ModelConfig, seq_len: int, peak_flops: float | None,
        n_devices: int = 1, recompute: str = "none") -> float | None:
    """Hardware FLOPs utilisation: like `mfu`, counting recomputed work too."""
    achieved = tokens_per_s * hardware_flops_per_token(model, seq_len, recompute)    # FLOP/s
    return achieved / (peak_flops * n_devices) if peak_flops else None

