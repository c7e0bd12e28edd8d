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
def layer_param_count(model: ModelConfig) -> int:
    """Weights of one transformer block: attention, the MLP and the two RMSNorm gains."""
    h, hd = model.dim, model.head_dim
    attention = h * model.n_heads * hd * 2 + h * model.n_kv_heads * hd * 2   # q, o; k, v
    mlp = model.mlp_matrices * h * model.ffn_dim                             # (gate,) up, down
    return attention + mlp + 2 * h


def param_count(model: ModelConfig, embeddings: bool = True) -> int:
    """Parameters of the model, exactly as `minipar.trainer.model.Transformer` holds them.

    embeddings=False leaves out the input embedding table (a lookup, no FLOPs) and keeps the
    output head (a matmul): that is the N of 6N. With tied embeddings the shared table is the
    head, so it stays.
    """
    table = model.vocab_size * model.dim
    head = 0 if model.tie_embeddings else table
    inputs = table if embeddings or model.tie_embeddings else 0
    return model.n_layers * layer_param_count(model) + model.dim + head + inputs  # + final norm


def local_param_count(model: ModelConfig, tp: int, layers: int, first: bool, last: bool) -> int:
    """Parameters one GPU holds: `layers` blocks sharded over tp (norm gains replicated), plus
    the vocab-parallel embedding on the first stage, the final norm and head on the last."""
    h = model.dim
    block = (layer_param_count(model) - 2 * h) // tp + 2 * h
    table = model.vocab_size * h // tp
    norm_and_head = h + (0 if model.tie_embeddings and first else table)
    return layers * block + (table if first else 0) + (norm_and_head if last else 0)


# ------------------------------------------------------------------ FLOPs
def dense_flops_per_token(model: ModelConfig) -> float:
    """6 N: the weight matmuls, forward and backward."""
    return 6.0 * param_count(model, embeddings=False)


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

