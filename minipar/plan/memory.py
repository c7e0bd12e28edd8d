"""The memory model: what one pipeline rank holds (which rank is the fullest is the cost
model's question: `costmodel.memory.fullest_stage`).

Chapter "Memory: where every byte goes". Torch-free. The one count of bytes that the
preflight (`runtime.preflight`: will this run fit on this machine?), the cost model
(`memory_breakdown_gb`, the planner's "fits") and the book all read. Its parts:

* bytes per parameter by precision (`Precision`) and ZeRO stage
  (`formulas.memory.zero_bytes_per_param`), times the parameters the rank holds;
* activations per token and layer (`formulas.memory`), times the layers of each of the
  rank's chunks and the micro-batches in flight on it (`formulas.memory.in_flight_chunks`).

Two accountings of activations, because they describe two programs (`Precision.kernels`):
* "eager" is minipar itself: the PyTorch code of `minipar.trainer.model`, tensor by tensor
  (`formulas.layer_saved_elements` and friends). `tests/test_memory.py` checks it against
  what `minipar.trainer.memory_meter.ActivationMeter` measures, within 5%.
* "fused" is Llama 3 on H100s: flash attention, fused norm and SwiGLU, Korthikanti et al.'s
  accounting (`formulas.activation_elements`), plus the whole sequence's K/V that
  all-gather context parallelism keeps, and on the last stage the logits with the loss's
  fp32 softmax (`formulas.logits_saved_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig, ParallelConfig
from .flops import local_expert_param_count, local_param_count
from .formulas.memory import (activation_elements, embedding_saved_bytes, head_saved_bytes,
                              in_flight_chunks, layer_saved_elements, logits_saved_bytes,
                              rope_saved_elements, weight_pass_kept_elements,
                              zero_bytes_per_param)
from .schedules import rank_layers, stage_layer_counts, stage_moe_counts


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a GPU stores and sends, and whose kernels keep the
    activations ("fused": Llama 3's; "eager": minipar's own model)."""

    param_bytes: int = 2        # the weights the matmuls read (and ZeRO all-gathers)
    grad_bytes: int = 4         # gradients as accumulated
    act_bytes: int = 2          # activations, and what TP, CP and PP send
    optimizer_bytes: int = 12   # per parameter: Adam's m and v (+ fp32 master weights)
    reduce_bytes: int = 4       # gradients as data parallelism reduces them
    kernels: str = "fused"

    @property
    def state_bytes_per_param(self) -> int:
        """Weights, gradients and optimizer state: what each parameter costs before sharding."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


# Llama 3: bf16 weights and activations; "FP32 gradient accumulation during backward
# computation over multiple micro-batches and also reduce-scatter gradients in FP32"
# (section 3.3.2); fp32 master weights and Adam moments.
BF16_MIXED = Precision(param_bytes=2, grad_bytes=4, act_bytes=2, optimizer_bytes=12, reduce_bytes=4)
# minipar: float32 weights, gradients and AdamW's two moments, no separate master copy (on a
# GPU too: autocast runs the matmuls in bf16 from the fp32 weights).
FP32 = Precision(param_bytes=4, grad_bytes=4, act_bytes=4, optimizer_bytes=8, reduce_bytes=4,
                 kernels="eager")
PRECISIONS = {"bf16": BF16_MIXED, "fp32": FP32}


def layer_bytes(model: ModelConfig, pc: ParallelConfig, precision: Precision,
                recompute: str) -> float:
    """Bytes per token one transformer layer keeps for the backward on one GPU."""
    if precision.kernels == "eager":
        return layer_saved_elements(model, pc.tp, pc.sp, pc.cp, pc.cp_impl, recompute) * precision.act_bytes
    elements = activation_elements(model, pc.tp, pc.sp, recompute)
    if pc.cp > 1 and pc.cp_impl == "allgather" and recompute == "none":
        elements += 2 * model.n_kv_heads * model.head_dim * (pc.cp - 1) / pc.tp
    return elements * precision.act_bytes


def activation_bytes(model: ModelConfig, pc: ParallelConfig, precision: Precision,
                     seq_len: int, microbatch_size: int, stage: int,
                     recompute_layers: int | None = None, expert_load: float = 1.0) -> float:
    """Peak bytes of activations on pipeline rank `stage`, running `pc.microbatches`
    micro-batches of `microbatch_size` sequences with `pc.recompute`: each chunk's in-flight
    micro-batches times what its layers keep (+ RoPE's tables, the embedding's ids and the
    head's softmax where they live), plus, under full recompute, one layer recomputed.
    `recompute_layers` N (the cost model's --recompute-layers, with full recompute): only the
    first N layers of each chunk keep just their input (Megatron's --recompute-method
    block), the others all they save. A mixture-of-experts block keeps what its routed tokens
    need (`moe_extra_elements`; `expert_load`: this rank's routed tokens over the mean)."""
    v, tokens, recompute = pc.virtual_stages, microbatch_size * seq_len // pc.cp, pc.recompute
    flight = in_flight_chunks(pc.schedule, pc.pp, pc.microbatches, stage, v,
                              pc.consecutive_microbatches)
    layers = stage_layer_counts(model.n_layers, pc.pp * v)
    per_layer = layer_bytes(model, pc, precision, recompute) * tokens
    acts = sum(n * layers[c * pc.pp + stage] * per_layer for c, n in enumerate(flight))
    if model.is_moe:
        moes = stage_moe_counts(model, pc.pp * v)
        extra = moe_extra_elements(model, pc.tp, recompute, precision.kernels, expert_load)
        routed = sum(n * moes[c * pc.pp + stage] for c, n in enumerate(flight))
        acts += routed * extra * precision.act_bytes * tokens
    if recompute == "full" and recompute_layers is not None:
        kept = layer_bytes(model, pc, precision, "none") * tokens     # a layer not recomputed
        redone = [min(recompute_layers, layers[c * pc.pp + stage]) for c in range(v)]
        acts = sum(n * (r * per_layer + (layers[c * pc.pp + stage] - r) * kept)
                   for c, (n, r) in enumerate(zip(flight, redone)))
    head, act = 0.0, precision.act_bytes
    if precision.kernels == "eager":       # the small parts the eager code keeps besides the layers
        acts += sum(flight) * rope_saved_elements(model, seq_len // pc.cp) * act
        if stage == 0:
            acts += flight[0] * embedding_saved_bytes(tokens, pc.tp)
        if stage == pc.pp - 1:
            head = head_saved_bytes(model, tokens, pc.tp, pc.sp, act)
            acts += flight[-1] * head
    elif stage == pc.pp - 1:               # the logits and the loss's softmax (fused kernels)
        head = logits_saved_bytes(model, tokens, pc.tp, act)
        acts += flight[-1] * head
    if recompute == "full":
        # a backward frees the head's tensors before it recomputes the first block (except
        # zero-bubble's W: B kept the whole graph)
        freed = 0.0 if pc.pp > 1 and pc.schedule == "zb" else head
        acts += max(0.0, recompute_transient(model, pc, precision, tokens) - freed)
    return acts


def recompute_transient(model: ModelConfig, pc: ParallelConfig, precision: Precision,
                        tokens: int) -> float:
    """Full recompute: while a block's backward runs, everything it saves is back (its
    input is already there): one layer's worth.

    Zero-bubble's W is different: it reruns each block of the chunk and frees only what the
    weight gradients read (the two norms' outputs and the inputs of the linears); the rest of
    every block it recomputed stays until the chunk's W is done. So: one block whole, and
    what W leaves of the chunk's other blocks (`formulas.weight_pass_kept_elements`)."""
    once = (layer_bytes(model, pc, precision, "none") - layer_bytes(model, pc, precision, "full")) * tokens
    if pc.pp == 1 or pc.schedule != "zb" or precision.kernels != "eager":
        return once
    chunk_layers = max(stage_layer_counts(model.n_layers, pc.pp * pc.virtual_stages))
    left = weight_pass_kept_elements(model, pc.tp, pc.sp, pc.cp, pc.cp_impl) * precision.act_bytes * tokens
    return once + (chunk_layers - 1) * left


def memory_of_rank(model: ModelConfig, pc: ParallelConfig, precision: Precision,
                   seq_len: int, microbatch_size: int, stage: int,
                   recompute_layers: int | None = None, expert_load: float = 1.0) -> dict[str, float]:
    """Bytes pipeline rank `stage` holds: {"params", "grads", "optimizer", "activations",
    "total"}; ZeRO shards the first three over the dp x cp group by its stage, and a mixture
    of experts' routed experts (E / ep on each EP rank) over the dp x cp / ep ranks that hold
    the same experts (the expert-data-parallel group, `expert_state_bytes`)."""
    layers = rank_layers(model, pc.pp, pc.virtual_stages, stage)
    moes = rank_layers(model, pc.pp, pc.virtual_stages, stage, moe=True)
    params = local_param_count(model, pc.tp, layers, stage == 0, stage == pc.pp - 1, moes)
    per_param = zero_bytes_per_param(pc.zero, pc.dp * pc.cp, precision.param_bytes,
                                     precision.grad_bytes, precision.optimizer_bytes)
    experts = expert_state_bytes(model, pc, precision, moes)
    out = {part: params * nbytes + experts[part] for part, nbytes in per_param.items()}
    out["activations"] = activation_bytes(model, pc, precision, seq_len, microbatch_size, stage,
                                          recompute_layers, expert_load)
    out["total"] = sum(out.values())
    return out


def expert_state_bytes(model: ModelConfig, pc: ParallelConfig, precision: Precision,
                       moe_layers: int) -> dict[str, float]:
    """Bytes of the routed experts of `moe_layers` blocks one EP rank holds, by part: ZeRO
    shards them over the expert-data-parallel group, dp x cp / ep ranks."""
    per_param = zero_bytes_per_param(pc.zero, pc.dp * pc.cp // pc.ep, precision.param_bytes,
                                     precision.grad_bytes, precision.optimizer_bytes)
    n = local_expert_param_count(model, pc.tp, pc.ep, moe_layers)
    return {part: n * nbytes for part, nbytes in per_param.items()}


def moe_extra_elements(model: ModelConfig, tp: int, recompute: str, kernels: str,
                       expert_load: float = 1.0) -> float:
    """Elements per token a mixture-of-experts block keeps beyond a dense block of ffn_dim:
    the router's E scores; for each of its top_k routed copies (times `expert_load`, the
    rank's routed tokens over the mean) the dispatched input and the expert's output (the
    combine's weights need it), and the expert's MLP activations; the shared experts' MLP
    activations; less the dense MLP's. Full recomputation keeps only the block's input."""
    if not model.is_moe or recompute == "full":
        return 0.0
    mlp = 4 if kernels == "eager" else model.mlp_matrices - (recompute == "selective")
    expert = mlp * model.expert_ffn_dim / tp
    routed = model.moe_top_k * expert_load * (2 * model.dim + expert)
    return model.moe_experts + routed + model.moe_shared_experts * expert - mlp * model.ffn_dim / tp

