"""The software stack is an input: what each framework overlaps, reduces, fuses and shards.

Chapter "MFU and communication volume". Two runs of the same layout on the same GPUs differ
by what their framework does: which attention kernel, whether pointwise ops are fused, in
which dtype gradients are reduced and in what pieces, what hides behind what. A `Framework`
names those behaviours, each with where its framework's source or docs say so, and `apply`
turns them into the layout, precision and kernels `estimate` takes. Nothing here is tuned
to a published MFU; where a behaviour is not documented the profile says "assumption".
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..config import ConfigError, ModelConfig, ParallelConfig, unknown
from .constants import LLAMA3_EFFICIENCY, Efficiency
from ..flops import local_param_count
from ..memory import BF16_MIXED, Precision


@dataclass(frozen=True)
class Framework:
    """One software stack's behaviours.

    kernels:      attention kernel, pointwise fusion, loss (`Efficiency`)
    reduce_bytes: bytes per gradient element data parallelism reduces (4: fp32, 2: bf16)
    grad_bytes:   bytes per element of the gradient buffer it accumulates into (None: the
                  precision's own, fp32 in bf16 mixed precision)
    bucket:       what one DP collective carries: "layer" (FSDP's unit: one transformer
                  block's parameters), "dp-scaled" (Megatron's: max(40M, 1M x the DP
                  group) gradient elements, so that a wide group's latency stays small
                  beside its bytes) or a size in MB
    zero:         the ZeRO stage its data parallelism is (None: the layout's own)
    zero_with_pp: the ZeRO stage under pipeline parallelism, where it differs (None: `zero`)
    tp_overlap:   TP's all-gather / reduce-scatter pipelined with the matmuls (its default;
                  --tp-comm-overlap on/off overrides it)
    cp_impl:      how its context parallelism exchanges K/V (None: the layout's own)
    optimizer_bytes: bytes of optimizer state per parameter (None: the precision's own)
    sources:      {behaviour: where its framework says so}
    """

    name: str
    kernels: Efficiency
    reduce_bytes: int = 4
    grad_bytes: int | None = None
    bucket: str | float = 25.0
    zero: int | None = None
    tp_overlap: bool = False
    sources: dict = field(default_factory=dict)
    zero_with_pp: int | None = None
    cp_impl: str | None = None
    optimizer_bytes: int | None = None


LLAMA3 = Framework(
    "llama3", LLAMA3_EFFICIENCY, reduce_bytes=4, bucket="layer", zero=2, tp_overlap=False,
    sources={
        "reduce_bytes": "paper 3.3.2: 'reduce-scatter gradients in FP32 across data parallel workers in FSDP'",
        "bucket": "paper 3.3.2: FSDP shards the optimizer state and gradients, one unit per layer (PyTorch FSDP wraps each block)",
        "zero": "paper 3.3.2: FSDP shards the optimizer state and the fp32 gradients (ZeRO-2); 'we do not "
                "reshard after forward' keeps the bf16 weights gathered (no ZeRO-3 all-gathers)",
        "tp_overlap": "assumption: the paper names no TP communication overlap",
        "kernels": "assumption: the paper names no kernels; cuDNN-class attention and fused pointwise kernels on H100",
    })

MEGATRON = Framework(
    "megatron", Efficiency(attention="cudnn", cross_entropy="fused"), reduce_bytes=4,
    bucket="dp-scaled", zero=1, tp_overlap=True, cp_impl="ring",
    sources={
        "cp_impl": "--cp-comm-type p2p (its default): Transformer Engine's ring of K/V sends, "
                   "overlapped with the attention of the block in hand",
        "reduce_bytes": "megatron/training/arguments.py: --bf16 sets accumulate_allreduce_grads_in_fp32 "
                        "(grad_reduce_in_fp32) unless --grad-reduce-in-bf16",
        "bucket": "distributed_data_parallel_config.py: bucket_size = max(40M, 1M x dp) elements",
        "zero": "--use-distributed-optimizer (its recipes' default): optimizer state sharded, grads reduce-scattered",
        "tp_overlap": "--tp-comm-overlap (Transformer Engine userbuffers), on in its H100 recipes",
        "kernels": "Transformer Engine: cuDNN fused attention, fused RMSNorm/RoPE/SwiGLU, fused cross-entropy",
    })

# NeMo 24.09's recipes (github.com/NVIDIA/dgxc-benchmarking v24.11.1, each recipe's yaml):
# Megatron-core under NeMo's own optimizer. The bucket size, TP overlap and pipeline p2p
# overlap differ from recipe to recipe (`calibration.NEMO_RECIPES` carries each one's).
NEMO = Framework(
    "nemo", Efficiency(attention="cudnn", cross_entropy="fused"), reduce_bytes=2, grad_bytes=2,
    bucket=75.0, zero=1, tp_overlap=True, cp_impl="ring",
    sources={
        "cp_impl": "Megatron-core's context parallelism, cp_comm_type p2p: a ring of K/V sends",
        "reduce_bytes": "recipe yaml, optim: name distributed_fused_adam, grad_sync_dtype: bf16",
        "grad_bytes": "Apex DistributedFusedAdam keeps its gradient buckets in grad_sync_dtype (bf16 here)",
        "bucket": "recipe yaml, optim.bucket_cap_mb (75 MB for Llama 3.1 8B/70B; 50 to 220 in others)",
        "zero": "distributed_fused_adam with overlap_grad_sync and overlap_param_sync: optimizer state "
                "sharded, gradients reduce-scattered once per step, weights all-gathered during the next forward",
        "tp_overlap": "recipe yaml, ub_tp_comm_overlap (true for most; false for Nemotron-4 340B)",
        "kernels": "recipe yaml: transformer_engine, use_flash_attention, apply_rope_fusion, "
                   "bias_activation_fusion, cross_entropy_loss_fusion: true",
        "p2p_overlap": "recipe yaml, overlap_p2p_comm (false with batch_p2p_comm: true for Nemotron-4)",
        "tp_comm_sms": "recipe yaml, ub_tp_comm_overlap_cfg: proj_fprop and fc2_fprop use method pipeline "
                       "with num_sm 8 to 24 and set_sm_margin 1 (the GEMM runs on the other SMs)",
    })

NANOTRON = Framework(
    "nanotron", Efficiency(attention="flash2", elementwise="eager", cross_entropy="eager"),
    reduce_bytes=4, bucket=25.0, zero=None, tp_overlap=False,
    sources={
        "reduce_bytes": "nanotron config: accumulate_grad_in_fp32 (fp32 gradient buffers are reduced)",
        "bucket": "torch DistributedDataParallel's default bucket_cap_mb = 25",
        "zero": "the run's own zero_stage (0 or 1)",
        "tp_overlap": "nanotron TensorParallelLinearMode.REDUCE_SCATTER: collectives not pipelined with the GEMMs",
        "kernels": "nanotron models/llama.py: flash_attn_varlen_func (FlashAttention-2), SwiGLU and residuals in "
                   "eager PyTorch, sharded_cross_entropy computed in fp32 op by op",
    })

DEEPSPEED = Framework(
    "deepspeed", Efficiency(attention="flash2", elementwise="eager", cross_entropy="eager"),
    reduce_bytes=2, bucket=5e8 * 2 / 1e6, zero=3, tp_overlap=False,
    sources={
        "reduce_bytes": "DeepSpeed: communication_data_type defaults to the model's dtype (bf16)",
        "bucket": "DeepSpeed ZeRO-3: reduce_bucket_size = 5e8 elements; stage3_prefetch_bucket_size = 5e7",
        "zero": "ZeRO stage 3: parameters, gradients and optimizer sharded",
        "tp_overlap": "no tensor parallelism of its own",
        "kernels": "a Hugging Face model in eager PyTorch with FlashAttention-2",
    })

# torchtitan (github.com/pytorch/torchtitan v0.1.0, f7084fc, June 2025: the stack of its
# published Llama 3.1 runs, benchmarks/llama3_h100_202412_torchtitan.md): FSDP2 +
# TP (+ PP), each TransformerBlock its own fully_shard unit.
TORCHTITAN = Framework(
    "torchtitan", Efficiency(attention="flash2", elementwise="fused", cross_entropy="fused"),
    reduce_bytes=4, bucket="layer", zero=3, zero_with_pp=1, tp_overlap=False,
    sources={
        "reduce_bytes": "torchtitan/config_manager.py: mixed_precision_reduce = 'float32', passed to "
                        "FSDP2 as MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) "
                        "(models/llama3/infra/parallelize.py apply_fsdp)",
        "bucket": "models/llama3/infra/parallelize.py apply_fsdp: fully_shard(transformer_block) for "
                  "each block, then the root: FSDP2's unit is one block's parameters",
        "zero": "config_manager.py: fsdp_reshard_after_forward = 'default'; apply_fsdp: 'default' "
                "reshards after forward (every block but the last) without PP: weights all-gathered "
                "again in backward, gradients reduce-scattered per backward (ZeRO-3)",
        "zero_with_pp": "apply_fsdp: with PP 'default' does not reshard after forward ('to avoid "
                        "per-microbatch all-gathers'); torch/distributed/pipelining/stage.py turns "
                        "off gradient sync until perform_reduce_grad after the last micro-batch: one "
                        "reduce-scatter and one all-gather per step, the optimizer sharded (ZeRO-1)",
        "tp_overlap": "config_manager.py: enable_async_tensor_parallel = False (async TP needs "
                      "torch.compile; llama3_405b.toml turns it on: --tp-comm-overlap on)",
        "kernels": "models/attention.py ScaledDotProductAttention: SDPA with FLASH_ATTENTION first on "
                   "H100 (cuDNN first only on B200); pointwise fused by torch.compile per "
                   "TransformerBlock and of the loss (training.compile, default False, true in "
                   "llama3_405b.toml and in every 2D/3D run of its benchmarks)",
    })

# DeepSeek-V3's own stack, HAI-LLM (DeepSeek-V3 technical report, arXiv 2412.19437): PP16
# under DualPipe, EP64, ZeRO-1, no TP. Its GEMMs run in FP8 (section 3.3.1: "theoretically
# doubles the computational speed"); the cost model has no FP8 kernel measured, so it times
# them as the measured bf16 ones (a slower step than FP8's) and states MFU against the dense
# bf16 peak (989.4 TFLOP/s on an H800), never the FP8 one (1,979).
DEEPSEEK = Framework(
    "deepseek", Efficiency(network=160 / 200, attention="cudnn", elementwise="fused",
                           cross_entropy="fused", ep_overlap=True, ep_comm_sms=20, dispatch_bytes=1),
    reduce_bytes=4, grad_bytes=4, optimizer_bytes=8, bucket="layer", zero=1, tp_overlap=False,
    sources={
        "network": "report 3.2.2: 'NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of IB "
                   "(50 GB/s)': 160 measured of the H800's 200 per direction; 50 GB/s is the 400 Gb/s "
                   "NIC's data-sheet rate, so the NIC keeps nccl-tests' share",
        "ep_overlap": "report 3.2.1: DualPipe overlaps each chunk's all-to-all dispatch and combine with "
                      "another chunk's compute: 'both all-to-all and PP communication can be fully hidden'",
        "ep_comm_sms": "report 3.2.2 and 3.5.1: 'only 20 SMs are sufficient to fully utilize the bandwidths "
                       "of IB and NVLink'; '20 out of the 132 SMs available in the H800 GPU'",
        "dispatch_bytes": "report 3.3.3: activations quantized to FP8 before the dispatch; the combine "
                          "stays in BF16",
        "optimizer_bytes": "report 3.3.3: AdamW's moments in BF16, the master weights in FP32: 4 + 2 + 2",
        "grad_bytes": "report 3.3.3: gradients 'retained in FP32'",
        "zero": "report 3.2: 'ZeRO-1 Data Parallelism'",
        "tp_overlap": "report 3.2: no tensor parallelism ('without using costly Tensor Parallelism')",
        "kernels": "assumption: GEMMs at the measured bf16 speed (no FP8 kernel on file; the report's FP8 "
                   "would be faster); cuDNN-class attention, fused pointwise kernels",
        "bucket": "assumption: the report names no DP bucket; one block's gradients per collective",
        "reduce_bytes": "assumption: the report says gradients are kept in FP32, not how they are reduced",
    })

FRAMEWORKS = {f.name: f for f in (LLAMA3, MEGATRON, NEMO, NANOTRON, DEEPSPEED, TORCHTITAN, DEEPSEEK)}
PRESET_FRAMEWORK = {"llama3-405b": "llama3", "llama3-70b": "llama3", "llama3-8b": "llama3",
                    "deepseek-v3": "deepseek"}


def framework(name: str) -> Framework:
    if name not in FRAMEWORKS:
        raise ConfigError(unknown("--framework", name, tuple(FRAMEWORKS)))
    return FRAMEWORKS[name]


def fsdp_unit_mb(model: ModelConfig, tp: int, precision: Precision = BF16_MIXED) -> float:
    """MB of gradients of one transformer layer on one TP rank: FSDP's unit, the size of
    each of its reduce-scatters and all-gathers (Llama 3 wraps each layer). Large messages
    keep the rings of a DP group of hundreds of servers bandwidth-bound, not latency-bound."""
    return local_param_count(model, tp, 1, False, False) * precision.grad_bytes / 1e6


def megatron_bucket_mb(pc: ParallelConfig, reduce_bytes: int) -> float:
    """MB of one Megatron DDP bucket: max(40M, 1M x the DP group's ranks) gradient elements
    (`distributed_data_parallel_config.py`), in the dtype they are reduced in."""
    return max(40e6, 1e6 * pc.dp * pc.cp) * reduce_bytes / 1e6


def bucket_mb(fw: Framework, model: ModelConfig, pc: ParallelConfig, precision: Precision) -> float:
    """MB each of `fw`'s DP collectives carries in the layout `pc` (`Framework.bucket`)."""
    if fw.bucket == "layer":
        return fsdp_unit_mb(model, pc.tp, precision)
    if fw.bucket == "dp-scaled":
        return megatron_bucket_mb(pc, fw.reduce_bytes)
    return float(fw.bucket)


def apply(fw: Framework, model: ModelConfig, pc: ParallelConfig,
          precision: Precision = BF16_MIXED,
          tp_overlap: bool | None = None) -> tuple[ParallelConfig, Precision, Efficiency]:
    """The layout, precision and kernels a run of `pc` has under `fw`. `tp_overlap`
    (--tp-comm-overlap on/off) replaces the framework's own TP overlap (None: keep it)."""
    overlap = fw.tp_overlap if tp_overlap is None else tp_overlap
    pc = pc.replace(bucket_mb=bucket_mb(fw, model, pc, precision), tp_overlap=overlap and pc.sp)
    if fw.cp_impl is not None:
        pc = pc.replace(cp_impl=fw.cp_impl)
    zero = fw.zero_with_pp if pc.pp > 1 and fw.zero_with_pp is not None else fw.zero
    if zero is not None:
        pc = pc.replace(zero=zero)
    grads = precision.grad_bytes if fw.grad_bytes is None else fw.grad_bytes
    state = precision.optimizer_bytes if fw.optimizer_bytes is None else fw.optimizer_bytes
    return pc, replace(precision, reduce_bytes=fw.reduce_bytes, grad_bytes=grads,
                       optimizer_bytes=state), fw.kernels
