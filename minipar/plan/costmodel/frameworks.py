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
    bucket:       what one DP collective carries: "layer" (FSDP's unit: one transformer
                  block's parameters) or a size in MB
    zero:         the ZeRO stage its data parallelism is (None: the layout's own)
    tp_overlap:   TP's all-gather / reduce-scatter pipelined with the matmuls
    sources:      {behaviour: where its framework says so}
    """

    name: str
    kernels: Efficiency
    reduce_bytes: int = 4
    bucket: str | float = 25.0
    zero: int | None = None
    tp_overlap: bool = False
    sources: dict = field(default_factory=dict)


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
    "megatron", Efficiency(attention="cudnn", cross_entropy="fused"), reduce_bytes=2,
    bucket=40e6 * 2 / 1e6, zero=1, tp_overlap=True,
    sources={
        "reduce_bytes": "megatron/core/distributed/distributed_data_parallel_config.py: grad_reduce_in_fp32 = False",
        "bucket": "distributed_data_parallel_config.py: bucket_size = max(40M, 1M x dp) elements",
        "zero": "--use-distributed-optimizer (its recipes' default): optimizer state sharded, grads reduce-scattered",
        "tp_overlap": "--tp-comm-overlap (Transformer Engine userbuffers), on in its H100 recipes",
        "kernels": "Transformer Engine: cuDNN fused attention, fused RMSNorm/RoPE/SwiGLU, fused cross-entropy",
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

FRAMEWORKS = {f.name: f for f in (LLAMA3, MEGATRON, NANOTRON, DEEPSPEED)}
PRESET_FRAMEWORK = {"llama3-405b": "llama3", "llama3-70b": "llama3", "llama3-8b": "llama3"}


def framework(name: str) -> Framework:
    if name not in FRAMEWORKS:
        raise ConfigError(unknown("--framework", name, tuple(FRAMEWORKS)))
    return FRAMEWORKS[name]


def fsdp_unit_mb(model: ModelConfig, tp: int, precision: Precision = BF16_MIXED) -> float:
    """MB of gradients of one transformer layer on one TP rank: FSDP's unit, the size of
    each of its reduce-scatters and all-gathers (Llama 3 wraps each layer). Large messages
    keep the rings of a DP group of hundreds of servers bandwidth-bound, not latency-bound."""
    return local_param_count(model, tp, 1, False, False) * precision.grad_bytes / 1e6


def apply(fw: Framework, model: ModelConfig, pc: ParallelConfig,
          precision: Precision = BF16_MIXED) -> tuple[ParallelConfig, Precision, Efficiency]:
    """The layout, precision and kernels a run of `pc` has under `fw`."""
    bucket = fsdp_unit_mb(model, pc.tp, precision) if fw.bucket == "layer" else float(fw.bucket)
    pc = pc.replace(bucket_mb=bucket, tp_overlap=fw.tp_overlap and pc.sp)
    if fw.zero is not None:
        pc = pc.replace(zero=fw.zero)
    return pc, replace(precision, reduce_bytes=fw.reduce_bytes), fw.kernels
