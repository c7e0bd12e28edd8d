"""`python -m minipar.costmodel`: predict a step from the command line.

Chapter "MFU and communication volume". Flags for the model (a preset, or any field
overridden), the hardware, the layout and batch, the numerics and the model's constants; the
answer as a short report or, with --json, as one JSON object (`Estimate.as_dict`). A layout
that cannot run is one line on stderr naming the flag and the rule, and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from ..config import SCHEDULES, ConfigError, ModelConfig, ParallelConfig
from .constants import LLAMA3_EFFICIENCY, PRECISIONS, RECOMPUTE, Efficiency
from .hardware import LLAMA3_CLUSTER, Cluster
from .time import Estimate, estimate
from .workload import Workload, make_workload


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr and exit status 2, no usage block."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m minipar.costmodel",
                description="Predict MFU, step time, memory and comm bytes of a 4D-parallel "
                            "training step. Defaults: Llama 3 405B, Table 4 row 1.")
    g = p.add_argument_group("model (a preset, or any field of it overridden)")
    g.add_argument("--preset", default="llama3-405b",
                   help="a model preset (default llama3-405b); the hardware is the Llama 3 "
                        "cluster unless overridden below")
    for flag, dest in (("--layers", "n_layers"), ("--dim", "dim"), ("--ffn-dim", "ffn_dim"),
                       ("--heads", "n_heads"), ("--kv-heads", "n_kv_heads"), ("--vocab", "vocab_size")):
        g.add_argument(flag, dest=dest, type=int)
    g = p.add_argument_group("hardware (defaults: the Llama 3 cluster)")
    for flag, dest, typ in (("--peak-tflops", "peak_tflops", float), ("--hbm-gb", "hbm_gb", float),
                            ("--gpus-per-node", "gpus_per_node", int),
                            ("--intra-node-GBps", "intra_node_GBps", float),
                            ("--inter-node-Gbps", "inter_node_Gbps", float)):
        g.add_argument(flag, dest=dest, type=typ)
    _add_layout_flags(p.add_argument_group("layout and batch"))
    g = p.add_argument_group("numerics and the model's constants")
    g.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16",
                   help="bf16: Llama 3's mixed precision; fp32: minipar on CPU")
    e = LLAMA3_EFFICIENCY
    g.add_argument("--dense-efficiency", type=float, default=e.dense)
    g.add_argument("--attention-efficiency", type=float, default=e.attention)
    g.add_argument("--network-efficiency", type=float, default=e.network)
    p.add_argument("--json", action="store_true", help="print the estimate as one JSON object")
    return p


def _add_layout_flags(g) -> None:
    g.add_argument("--gpus", type=int, help="total GPUs; must equal tp*cp*pp*dp (default: that product)")
    g.add_argument("--tp", type=int, default=8)
    g.add_argument("--cp", type=int, default=1)
    g.add_argument("--pp", type=int, default=16)
    g.add_argument("--dp", type=int, help="default: --gpus / (tp*cp*pp), or 64 without --gpus")
    g.add_argument("--seq-len", type=int, default=8192)
    b = g.add_mutually_exclusive_group()
    b.add_argument("--global-batch-tokens", type=int, help="tokens per step (default 16M = 2048 x 8192)")
    b.add_argument("--global-batch", type=int, help="sequences per step")
    g.add_argument("--microbatch-size", type=int, default=1, help="sequences per micro-batch")
    g.add_argument("--schedule", choices=SCHEDULES, default="interleaved")
    g.add_argument("--virtual-stages", type=int, default=None,
                   help="chunks per pipeline rank (default with --schedule interleaved: 8, or "
                        "the most, a power of two, that pp x v <= layers + 2 allows; else 1)")
    g.add_argument("--zero", type=int, default=1)
    g.add_argument("--recompute", choices=RECOMPUTE, default="none")
    g.add_argument("--cp-impl", choices=("ring", "allgather"), default="allgather")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism (default: on when tp > 1)")
    g.add_argument("--bucket-mb", type=float, default=25.0)


def _model_and_cluster(args) -> tuple[ModelConfig, Cluster]:
    try:
        model = ModelConfig.preset(args.preset)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--model", "--preset")) from None
    overrides = {k: getattr(args, k) for k in ("n_layers", "dim", "ffn_dim", "n_heads",
                                               "n_kv_heads", "vocab_size") if getattr(args, k) is not None}
    if overrides:
        model = replace(model, name="custom", **overrides)
    cluster = LLAMA3_CLUSTER
    hw = {k: getattr(args, k) for k in ("peak_tflops", "hbm_gb", "gpus_per_node",
                                        "intra_node_GBps", "inter_node_Gbps") if getattr(args, k) is not None}
    if hw:
        cluster = replace(cluster, name="custom", **hw)
    return model, cluster


def _dp_of(args) -> int:
    """--dp, or what --gpus leaves of tp*cp*pp; checked against --gpus."""
    dp = args.dp
    inner = args.tp * args.cp * args.pp
    if dp is None:
        if args.gpus is None:
            dp = 64
        elif inner > 0 and args.gpus % inner == 0:
            dp = args.gpus // inner
        else:
            raise ConfigError(f"--gpus {args.gpus} is not divisible by tp*cp*pp = "
                              f"{args.tp}*{args.cp}*{args.pp} = {inner}")
    if args.gpus is not None and args.gpus != inner * dp:
        raise ConfigError(f"--gpus {args.gpus} must equal tp*cp*pp*dp = "
                          f"{args.tp}*{args.cp}*{args.pp}*{dp} = {inner * dp}")
    return dp


def config_from_args(args) -> tuple[ModelConfig, Cluster, ParallelConfig, Workload]:
    """Turn parsed flags into the four objects; ConfigError names the flag and the rule."""
    model, cluster = _model_and_cluster(args)
    dp = _dp_of(args)
    v = args.virtual_stages
    if v is None:                 # Llama 3's 8 chunks per rank, or as many as the layers allow
        v = 1
        while args.schedule == "interleaved" and v < 8 and args.pp * v * 2 <= model.n_layers + 2:
            v *= 2
    sp = args.sp if args.sp is not None else args.tp > 1
    parallel = ParallelConfig(tp=args.tp, cp=args.cp, pp=args.pp, dp=dp, zero=args.zero,
                              bucket_mb=args.bucket_mb, sp=sp, schedule=args.schedule,
                              virtual_stages=v, cp_impl=args.cp_impl)
    work = make_workload(args.seq_len, args.global_batch_tokens, args.global_batch,
                         args.microbatch_size, args.recompute)
    return model, cluster, parallel, work


def human_bytes(n: float) -> str:
    """1234567 -> '1.23 MB' (decimal units, as link speeds are quoted)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def format_estimate(e: Estimate, model: ModelConfig, cluster: Cluster) -> str:
    pc, w = e.parallel, e.workload
    lines = [
        f"model    {model.name}: {model.n_layers} layers, dim {model.dim}, ffn {model.ffn_dim}, "
        f"{model.n_heads} heads ({model.n_kv_heads} KV), vocab {model.vocab_size}",
        f"cluster  {cluster.name}: {cluster.peak_tflops:g} TFLOP/s, {cluster.hbm_gb:g} GB, "
        f"{cluster.gpus_per_node}/node, NVLink {cluster.intra_node_GBps:g} GB/s, NIC {cluster.inter_node_Gbps:g} Gb/s",
        f"layout   {pc.world_size} GPUs = TP{pc.tp} CP{pc.cp} PP{pc.pp} DP{pc.dp}, {pc.schedule}"
        + (f" v={pc.virtual_stages}" if pc.virtual_stages > 1 else "")
        + f", ZeRO-{pc.zero}, SP {'on' if pc.sp else 'off'}, CP {pc.cp_impl}, recompute {w.recompute}",
        f"batch    {w.global_batch} x {w.seq_len} tokens = {w.tokens:,}; micro-batch {w.microbatch_size}, "
        f"{e.microbatches} per DP rank",
        "",
        f"MFU              {100 * e.mfu:6.1f} %   (PaLM convention: 6N + 12 L h s FLOPs per token)",
        f"HFU              {100 * e.hfu:6.1f} %",
        f"TFLOP/s per GPU  {e.tflops_per_gpu:8.4g}",
        f"step time        {e.step_time_s:8.4g} s   ({e.tokens_per_s:,.0f} tokens/s)",
        f"bubble           {100 * e.bubble_fraction:6.1f} %",
        "time per step    " + ", ".join(f"{k} {v:.3g} s" for k, v in e.time_breakdown_s.items()),
        f"memory per GPU   {human_bytes(e.memory_gb_per_gpu * 1e9)} "
        + ("(fits)" if e.fits_memory else f"(DOES NOT FIT in {cluster.hbm_gb:g} GB)") + ": "
        + ", ".join(f"{k} {human_bytes(v * 1e9)}" for k, v in e.memory_breakdown_gb.items()),
        "bytes per GPU    " + ", ".join(f"{k} {human_bytes(v)}" for k, v in e.comm_bytes_per_gpu.items())
        + "   (sent per step, ring algorithm, pipeline rank 0)",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        model, cluster, parallel, work = config_from_args(args)
        eff = Efficiency(args.dense_efficiency, args.attention_efficiency, args.network_efficiency)
        for flag, value in (("--dense-efficiency", eff.dense), ("--attention-efficiency", eff.attention),
                            ("--network-efficiency", eff.network)):
            if not 0 < value <= 1:
                raise ConfigError(f"{flag} {value} must be in (0, 1]")
        e = estimate(model, parallel, cluster, work.seq_len, global_batch=work.global_batch,
                     microbatch_size=work.microbatch_size, recompute=work.recompute,
                     precision=PRECISIONS[args.precision], efficiency=eff)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(e.as_dict()))
    else:
        print(format_estimate(e, model, cluster))
    return 0
