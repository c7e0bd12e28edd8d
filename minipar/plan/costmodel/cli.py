"""`python -m minipar.costmodel`: predict a step from the command line.

Chapter "MFU and communication volume". Flags for the model (a preset, or any field
overridden), the hardware, the layout and batch, the numerics and the model's constants; the
answer as a short report or, with --json, as one JSON object (`Estimate.as_dict`). The layout
flags are `python -m minipar.train`'s, generated from the same config fields (`cli.add_flags`)
with this command's defaults (`LAYOUT_DEFAULTS`). A layout that cannot run is one line on
stderr naming the flag and the rule, and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

from ..config import MLPS, ConfigError, ModelConfig, ParallelConfig, TrainConfig, positive
from .band import band_note, mfu_band
from .catalog import all_constants
from .constants import LLAMA3_EFFICIENCY
from .untrusted import exit_1_on_damaged_data
from .defaults import apply_preset_layout, default_degrees, default_schedule
from .frameworks import FRAMEWORKS, PRESET_FRAMEWORK, apply
from .gpus import GPU_NAMES, gpu_cluster
from .hardware import FABRICS, LLAMA3_CLUSTER, Cluster
from .planner import (MEMORY_HEADROOM, REMEDIES, binding_constraint, describe, limiting_term,
                      losses, plan)
from .time import Estimate, estimate
from .workload import Workload, make_workload
from ..flags import Chosen, Parser, add_flags
from ..memory import PRECISIONS
from ..pipes import quiet_on_closed_pipe


# A mixture of experts' fields, overridable like the others (`ModelConfig`)
MOE_FLAGS = (("--moe-experts", "moe_experts"), ("--moe-top-k", "moe_top_k"),
             ("--moe-shared-experts", "moe_shared_experts"), ("--moe-ffn-dim", "moe_ffn_dim"),
             ("--moe-first-layer", "moe_first_layer"), ("--moe-max-nodes", "moe_max_nodes"))

# The layout flags are the trainer's (`ParallelConfig`, `TrainConfig`), with the cost model's
# defaults. Every knob whose best value depends on the others is `Chosen`: None on the command
# line, resolved for the layout given (`defaults`), so that only a flag the user passed can be
# refused.
LAYOUT_DEFAULTS = {
    "tp": Chosen("Table 4's 8 if it fits, else one server's worth"),
    "cp": Chosen("1"),
    "pp": Chosen("Table 4's 16 if it fits --gpus, else 1"),
    "dp": Chosen("--gpus / (tp*cp*pp), or 64 without --gpus"),
    "seq_len": 8192,
    "global_batch": Chosen("--global-batch-tokens / --seq-len"),
    "schedule": Chosen("interleaved with a pipeline whose micro-batches are a multiple of pp, "
                       "else 1f1b"),
    "virtual_stages": Chosen("with --schedule interleaved: 8, or the most, a power of two, "
                             "that pp x v <= layers + 2 allows; else 1"),
    "sp": Chosen("on when tp > 1"),
    "zero": 1,
    "cp_impl": "allgather",
}


class _Parser(Parser):
    prog_in_errors = False       # "error: ...": the cost model's lines have always read so

    def parse_args(self, args=None, namespace=None):
        """The flags, every number among them checked before any arithmetic sees it
        (`number_problem`): a bad one is one line and exit 2, like a malformed flag."""
        given = super().parse_args(args, namespace)
        bad = [line for a in self._actions if (line := number_problem(a, vars(given).get(a.dest)))]
        if bad:
            self.error(bad[0])
        return given


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m minipar.costmodel",
                description="Predict MFU, step time, memory and comm bytes of a 4D-parallel "
                            "training step. Defaults: Llama 3 405B, Table 4 row 1.")
    _add_model_and_hardware_flags(p)
    _add_layout_flags(p.add_argument_group("layout and batch"))
    g = p.add_argument_group("numerics and the software stack")
    g.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16",
                   help="bf16: Llama 3's mixed precision; fp32: minipar on CPU")
    g.add_argument("--framework", choices=tuple(FRAMEWORKS),
                   help="the software stack's behaviours (frameworks.py): kernels, reduce dtype, "
                        "DP buckets, ZeRO, TP overlap; default: the preset's own (llama3 for the "
                        "Llama 3 presets), else none: the layout flags as given, with fused "
                        "kernels. --zero, --bucket-mb, --tp-overlap given explicitly win")
    _add_tp_comm_overlap(g)
    p.add_argument("--json", action="store_true", help="print the estimate as one JSON object")
    return p


def tp_comm_overlap(args) -> bool | None:
    """--tp-comm-overlap as True or False (None: not given, the framework's own), refused
    beside the --tp-overlap it contradicts."""
    if args.tp_overlap and args.tp_comm_overlap == "off":
        raise ConfigError("--tp-comm-overlap off contradicts --tp-overlap: give one")
    return {"on": True, "off": False}.get(args.tp_comm_overlap)


def _add_tp_comm_overlap(g) -> None:
    g.add_argument("--tp-comm-overlap", choices=("on", "off"),
                   help="TP's all-gathers and reduce-scatters pipelined with the matmuls "
                        "(Megatron's --tp-comm-overlap, torchtitan's async TP), on or off whatever "
                        "the framework does (default: the framework's own; without one, "
                        "--tp-overlap's); on needs sequence parallelism")


def _add_model_and_hardware_flags(p) -> None:
    g = p.add_argument_group("model (a preset, or any field of it overridden)")
    g.add_argument("--preset", "--model", dest="preset", default="llama3-405b",
                   help="a model preset (default llama3-405b); the hardware is the Llama 3 "
                        "cluster unless --gpu or a field below says otherwise")
    for flag, dest in (("--layers", "n_layers"), ("--dim", "dim"), ("--ffn-dim", "ffn_dim"),
                       ("--heads", "n_heads"), ("--kv-heads", "n_kv_heads"), ("--vocab", "vocab_size")):
        g.add_argument(flag, dest=dest, type=int)
    g.add_argument("--mlp", choices=MLPS, help="the MLP: swiglu (Llama's: gate, up, down), gelu "
                   "(GPT-3's) or relu2 (squared ReLU, Nemotron-4's): up, down (default: the preset's)")
    for flag, dest in MOE_FLAGS:
        g.add_argument(flag, dest=dest, type=int, help=f"the model's {dest} (default: the preset's)")
    g.add_argument("--tied-embeddings", dest="tie_embeddings", action=argparse.BooleanOptionalAction,
                   help="the LM head shares the embedding's table (one table of vocab x dim, not "
                        "two); --no-tied-embeddings unties a preset's (default: the preset's)")
    g = p.add_argument_group("hardware (defaults: the Llama 3 cluster)")
    g.add_argument("--gpu", choices=GPU_NAMES, help="a GPU's data sheet (gpus.py), wired like "
                   "Llama 3's cluster; any field below overrides it")
    for flag, dest, typ in (("--peak-tflops", "peak_tflops", float), ("--hbm-gb", "hbm_gb", float),
                            ("--hbm-TBps", "hbm_TBps", float),
                            ("--gpus-per-node", "gpus_per_node", int),
                            ("--intra-node-GBps", "intra_node_GBps", float),
                            ("--inter-node-Gbps", "inter_node_Gbps", float)):
        g.add_argument(flag, dest=dest, type=typ)
    g.add_argument("--fabric", choices=FABRICS, help="the network across servers: infiniband "
                   "(alpha-beta at nccl-tests' InfiniBand/RoCE bus bandwidth, the default) or efa "
                   "(AWS p5's Elastic Fabric Adapter, read off its nccl-tests)")


def _add_layout_flags(g) -> None:
    g.add_argument("--gpus", type=int, help="total GPUs; must equal tp*cp*pp*dp (default: that product)")
    add_flags(g, ParallelConfig, ("tp", "cp", "pp", "dp", "ep"), LAYOUT_DEFAULTS)
    add_flags(g, TrainConfig, ("seq_len",), LAYOUT_DEFAULTS)
    _add_imbalance(g)
    b = g.add_mutually_exclusive_group()
    b.add_argument("--global-batch-tokens", type=_tokens,
                   help="tokens per step, e.g. 16M or 16777216 (default 16M = 2048 x 8192)")
    add_flags(b, TrainConfig, ("global_batch",), LAYOUT_DEFAULTS)
    g.add_argument("--microbatch-size", type=int, default=1, help="sequences per micro-batch")
    add_flags(g, ParallelConfig, ("schedule",), LAYOUT_DEFAULTS)
    v = g.add_mutually_exclusive_group()
    add_flags(v, ParallelConfig, ("virtual_stages",), LAYOUT_DEFAULTS)
    v.add_argument("--layers-per-virtual-stage", type=int, metavar="N",
                   help="layers per model chunk, Megatron's --num-layers-per-virtual-pipeline-"
                        "stage: --virtual-stages = layers / (pp x N); N must divide the layers "
                        "per pipeline stage (layers / pp, a whole number)")
    add_flags(g, ParallelConfig, ("zero", "recompute"), LAYOUT_DEFAULTS)
    g.add_argument("--recompute-layers", type=int, metavar="N",
                   help="full recomputation of only the first N layers of each pipeline stage "
                        "(each model chunk with --virtual-stages), the rest not: Megatron's "
                        "--recompute-granularity full --recompute-method block "
                        "--recompute-num-layers N; 0 <= N <= layers per stage, with --recompute "
                        "none or full")
    add_flags(g, ParallelConfig, ("cp_impl", "sp", "tp_overlap", "bucket_mb"), LAYOUT_DEFAULTS)


def _model_and_cluster(args) -> tuple[ModelConfig, Cluster]:
    model = ModelConfig.preset(args.preset, flag="--preset")
    overrides = {k: getattr(args, k) for k in ("n_layers", "dim", "ffn_dim", "n_heads",
                                               "n_kv_heads", "vocab_size", "mlp", "tie_embeddings",
                                               *(dest for _, dest in MOE_FLAGS))
                 if getattr(args, k) is not None}
    if overrides:
        model = replace(model, name="custom", **overrides)
    hw = {k: getattr(args, k) for k in ("peak_tflops", "hbm_gb", "hbm_TBps", "gpus_per_node",
                                        "intra_node_GBps", "inter_node_Gbps", "fabric") if getattr(args, k) is not None}
    cluster = gpu_cluster(args.gpu) if args.gpu else LLAMA3_CLUSTER
    if hw:
        cluster = replace(cluster, name=f"{cluster.name} (modified)", **hw)
    return model, cluster


def _layout(args, model: ModelConfig, cluster: Cluster) -> tuple[dict, list[str]]:
    """tp, cp, pp, dp from the flags given, the rest chosen (`defaults.default_degrees`);
    --gpus checked against the product, naming each degree as given or chosen."""
    given = {k: getattr(args, k) for k in ("tp", "cp", "pp", "dp")}
    degrees, notes = default_degrees(given, args.gpus, model, cluster.gpus_per_node)
    product = degrees["tp"] * degrees["cp"] * degrees["pp"] * degrees["dp"]
    if args.gpus is not None and args.gpus != product:
        names = "*".join(f"{degrees[k]}" + ("" if given[k] is not None else f" ({k}, default)")
                         for k in ("tp", "cp", "pp", "dp"))
        raise ConfigError(f"--gpus {args.gpus} must equal tp*cp*pp*dp = {names} = {product}")
    return degrees, notes


def config_from_args(args) -> tuple[ModelConfig, Cluster, ParallelConfig, Workload]:
    """Turn parsed flags into the four objects; ConfigError names the flag and the rule.
    The choices made for flags not given are in `args.notes` (a list of lines)."""
    model, cluster = _model_and_cluster(args)
    if model.problems():                       # before any default is derived from the model
        raise ConfigError(*model.problems())
    d, notes = _layout(args, model, cluster)
    work = make_workload(args.seq_len, args.global_batch_tokens, args.global_batch,
                         args.microbatch_size, args.recompute, args.recompute_layers)
    if args.dp is None and d["dp"] > 0 and work.global_batch > 0 and work.global_batch % d["dp"]:
        raise ConfigError(f"the global batch of {work.global_batch} sequences (--global-batch / "
                          f"--global-batch-tokens) cannot be split over dp = {d['dp']}, chosen as "
                          f"--gpus / (tp*cp*pp); pass --dp or another batch")
    m = work.global_batch // (d["dp"] * work.microbatch_size) if d["dp"] > 0 and work.microbatch_size > 0 else 1
    chunks = virtual_stages_of(args.layers_per_virtual_stage, model.n_layers, d["pp"],
                               args.pp is None, args.schedule)
    schedule, v, more = default_schedule(d["pp"], m, model.n_layers, args.schedule,
                                         args.virtual_stages if chunks is None else chunks)
    if chunks is not None:       # the chunks came from --layers-per-virtual-stage: say so
        more = [n.replace("--virtual-stages given", f"--layers-per-virtual-stage "
                          f"{args.layers_per_virtual_stage}: {chunks} chunks") for n in more]
    sp = args.sp if args.sp is not None else d["tp"] > 1
    for flag, on in (("--tp-overlap", args.tp_overlap), ("--tp-comm-overlap on", args.tp_comm_overlap == "on")):
        if on and not sp:
            raise ConfigError(f"{flag} needs sequence parallelism: " + (
                "drop --no-sp" if args.sp is False else f"it is off because --tp {d['tp']} is 1"))
    comm_overlap = tp_comm_overlap(args)
    parallel = ParallelConfig(tp=d["tp"], cp=d["cp"], pp=d["pp"], dp=d["dp"], ep=args.ep, zero=args.zero,
                              bucket_mb=args.bucket_mb, sp=sp,
                              tp_overlap=bool(args.tp_overlap or comm_overlap),
                              schedule=schedule, virtual_stages=v, cp_impl=args.cp_impl)
    args.notes = getattr(args, "preset_notes", []) + notes + more
    return model, cluster, parallel, replace(work, moe_imbalance=args.moe_imbalance)


def virtual_stages_of(per_chunk: int | None, n_layers: int, pp: int, pp_chosen: bool = False,
                      schedule: str | None = None) -> int | None:
    """--layers-per-virtual-stage N as chunks per pipeline rank, Megatron's rule
    (megatron/training/arguments.py): the layers divisible by pp, the layers per stage by N,
    virtual_pipeline_model_parallel_size = layers / pp / N. None when N is not given."""
    if per_chunk is None:
        return None
    flag, pp_flag = f"--layers-per-virtual-stage {per_chunk}", f"--pp {pp}" + (" (default)" if pp_chosen else "")
    if pp < 2:
        raise ConfigError(f"{flag} needs --pp > 1, not {pp_flag.split(' ', 1)[1]} (the chunks go "
                          "round the pipeline ranks)")
    if n_layers % pp:
        raise ConfigError(f"{flag} needs the {n_layers} layers divisible by {pp_flag} (Megatron: "
                          "'number of layers of the model must be divisible pipeline model parallel size')")
    if (n_layers // pp) % per_chunk:
        raise ConfigError(f"{flag} must divide the {n_layers // pp} layers per pipeline stage "
                          f"({n_layers} layers / {pp_flag})")
    v = n_layers // pp // per_chunk
    if v > 1 and schedule is not None and schedule != "interleaved":
        raise ConfigError(f"{flag} makes {v} chunks per pipeline rank: it needs --schedule "
                          f"interleaved, not {schedule}")
    return v


def human_bytes(n: float) -> str:
    """1234567 -> '1.23 MB' (decimal units, as link speeds are quoted)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def format_estimate(e: Estimate, model: ModelConfig, cluster: Cluster,
                    band: tuple[float, float] | None = None, band_source: str = "") -> str:
    pc, w = e.parallel, e.workload
    lines = [
        f"model    {model.name}: {model.n_layers} layers, dim {model.dim}, ffn {model.ffn_dim}, "
        f"{model.n_heads} heads ({model.n_kv_heads} KV), vocab {model.vocab_size}",
        f"cluster  {cluster.name}: {cluster.peak_tflops:g} TFLOP/s, {cluster.hbm_gb:g} GB, "
        f"{cluster.gpus_per_node}/node, NVLink {cluster.intra_node_GBps:g} GB/s, NIC {cluster.inter_node_Gbps:g} Gb/s {cluster.fabric}",
        f"layout   {pc.world_size} GPUs = TP{pc.tp} CP{pc.cp} PP{pc.pp} DP{pc.dp}, {pc.schedule}"
        + (f" v={pc.virtual_stages}" if pc.virtual_stages > 1 else "")
        + f", ZeRO-{pc.zero}, SP {'on' if pc.sp else 'off'}" + (" + TP overlap" if pc.tp_overlap else "")
        + f", CP {pc.cp_impl}, recompute {w.recompute}"
        + (f" (the first {w.recompute_layers} layers of each stage)" if w.recompute_layers else ""),
        f"batch    {w.global_batch} x {w.seq_len} tokens = {w.tokens:,}; micro-batch {w.microbatch_size}, "
        f"{e.microbatches} per DP rank",
        "",
        f"MFU              {100 * e.mfu:6.1f} %   (PaLM convention: 6N + 12 L h s FLOPs per token)",
        *([f"MFU band         {100 * band[0]:.0f} to {100 * band[1]:.0f} %   ({band_source})"] if band else []),
        f"HFU              {100 * e.hfu:6.1f} %",
        f"TFLOP/s per GPU  {e.tflops_per_gpu:8.4g}",
        f"step time        {e.step_time_s:8.4g} s   ({e.tokens_per_s:,.0f} tokens/s)",
        f"bubble           {100 * e.bubble_fraction:6.1f} %",
        "time per step    " + ", ".join(f"{k} {v:.3g} s" for k, v in e.time_breakdown_s.items()),
        f"the other {100 * (1 - e.mfu):.0f}%  " + ", ".join(
            f"{k} {100 * v / e.step_time_s:.1f}" for k, v in losses(e).items() if v > 0)
        + "   (points of the step each term costs: below peak, exposed, idle)",
        f"memory per GPU   {human_bytes(e.memory_gb_per_gpu * 1e9)} "
        + ("(fits)" if e.fits_memory else f"(DOES NOT FIT in {cluster.hbm_gb:g} GB)") + ": "
        + ", ".join(f"{k} {human_bytes(v * 1e9)}" for k, v in e.memory_breakdown_gb.items()),
        "bytes per GPU    " + ", ".join(f"{k} {human_bytes(v)}" for k, v in e.comm_bytes_per_gpu.items())
        + "   (sent per step, ring algorithm, pipeline rank 0)",
    ]
    return "\n".join(lines + expert_lines(e, cluster))


def expert_lines(e: Estimate, cluster: Cluster) -> list[str]:
    """A mixture of experts' own lines: active FLOPs, and the all-to-alls of the pace rank."""
    if not e.ep:
        return []
    x = e.ep
    return [f"experts          EP{x['ep']} on {x['span_gpus']} GPUs, imbalance {x['imbalance']:g} "
            f"(busiest rank {x['busiest_rank_load']:.2f}x the mean): {x['all_to_alls']:.0f} all-to-alls, "
            f"{human_bytes(x['all_to_all_bytes'])} ({human_bytes(x['nic_bytes'])} on the NIC), "
            f"{x['all_to_all_s']:.3g} s of which {x['exposed_s']:.3g} s exposed (pace rank, per step)",
            f"MFU counts       the active weights a token meets (6 N_active + 12 L h s), "
            f"against the dense bf16 peak ({cluster.peak_tflops:g} TFLOP/s), never an FP8 one"]


def _add_imbalance(g) -> None:
    g.add_argument("--moe-imbalance", type=float, default=1.0,
                   help="a mixture of experts' busiest expert load over the mean (1: balanced; "
                        "at most E / top_k): it slows the expert GEMMs and the all-to-alls")


def build_plan_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m minipar.costmodel plan",
                description="Every layout of a model on N GPUs that fits in memory, ranked by "
                            "predicted MFU, with what limits the best ones.")
    _add_model_and_hardware_flags(p)
    p.add_argument("--gpus", type=int, required=True, help="GPUs to use")
    add_flags(p, TrainConfig, ("seq_len",), LAYOUT_DEFAULTS)
    p.add_argument("--global-batch-tokens", type=_tokens, default=4 * 2**20,
                   help="tokens per step, e.g. 4M or 4194304 (default 4M)")
    add_flags(p, ParallelConfig, ("tp_overlap",))
    p.add_argument("--framework", choices=tuple(FRAMEWORKS),
                   help="estimate every layout under this software stack (frameworks.py): its "
                        "kernels, reduce dtype, DP units, TP overlap and ZeRO stage (default: "
                        "none: fused kernels, fp32 reduces per layer, the cheapest ZeRO that fits)")
    _add_tp_comm_overlap(p)
    p.add_argument("--memory-headroom", type=float, default=MEMORY_HEADROOM,
                   help="share of HBM a plan leaves free for what the memory model does not "
                        f"count (default {MEMORY_HEADROOM:g})")
    p.add_argument("--top", type=int, default=5)
    return p


def _tokens(text: str) -> int:
    """'4M' -> 4 * 2**20, '512K' -> 512 * 2**10, '4194304' -> 4194304."""
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except (ValueError, OverflowError):         # int(nan), int(inf): 1e400 reads as inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite token count like 4M or "
                                         "4194304") from None


# The rule of a number a flag takes, by the flag's type: a count (GPUs, degrees, layers,
# tokens, --top, ...) is a positive integer, a real number (bandwidths, efficiencies, ...)
# finite; each real's own range is checked where it is used. ZeRO's stage is no count: it is
# one of 0-3, checked with the layout.
COUNTS, NOT_COUNTS = (int, _tokens), ("zero", "recompute_layers")
NON_NEGATIVE = ("recompute_layers",)      # counts that may be 0


def number_problem(action: argparse.Action, value) -> str | None:
    """The line refusing `value` of a flag, or None when it obeys its type's rule."""
    flag = action.option_strings[0] if action.option_strings else action.dest
    if value is None or isinstance(value, bool):
        return None
    if action.type in COUNTS and action.dest not in NOT_COUNTS and value < 1:
        return f"{flag} {value} must be a positive integer"
    if action.dest in NON_NEGATIVE and value < 0:
        return f"{flag} {value} must be >= 0"
    if action.type is float and not math.isfinite(value):
        return f"{flag} {value} must be finite"
    return None


def non_finite(d, where: str = "") -> tuple[str, float] | None:
    """The first number of `d` (nested dicts and lists) that is NaN or infinite: (its key, it)."""
    if isinstance(d, float) and not math.isfinite(d):
        return where, d
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        if found := non_finite(v, f"{where}.{k}" if where else str(k)):
            return found
    return None


def refuse_non_finite(d: dict, parser, args, argv) -> None:
    """The rule of a physically absurd number (--peak-tflops 1e-320): a real flag need only be
    finite (and positive where `Cluster.problems` says), but an estimate is printed only when
    every number of it is finite (JSON has no NaN or Infinity). Else a ConfigError naming the
    number flags given, the likeliest cause: exit 2."""
    found = non_finite(d)
    if found is None:
        return
    given = [a for a in parser._actions if a.option_strings and a.type in (float, *COUNTS)
             and any(x == o or x.startswith(o + "=") for o in a.option_strings for x in argv)]
    floats = [a for a in given if a.type is float] or given
    named = ", ".join(f"{a.option_strings[0]} {getattr(args, a.dest)}" for a in floats)
    raise ConfigError(f"{named or 'the flags given'}: the estimate's {found[0]} would be "
                      f"{found[1]}: every number of an estimate must be finite, so a value this "
                      "far outside any real hardware or model is refused")


def format_plan(p, cluster: Cluster, framework: str | None = None) -> str:
    """The ranked layouts, each with its MFU band (`band.mfu_band` for runs under
    `framework`), its limiting term and the MFU without it."""
    if not p.ranked:
        return f"nothing fits ({p.tried} layouts tried): {binding_constraint(p, cluster)}"
    lines = [f"{p.tried} layouts tried, {sum(p.rejected.values())} ruled out "
             f"({', '.join(f'{k} {v}' for k, v in p.rejected.items()) or 'none'}); best first:"]
    best = p.ranked[0].mfu
    for i, e in enumerate(p.ranked, 1):
        first, share, term, part, without = limiting_term(e)
        low, high = mfu_band(e.mfu, framework)
        lines.append(f"{i}. {describe(e)}: MFU {100 * e.mfu:.0f}% (band {100 * low:.0f} to "
                     f"{100 * high:.0f}%), {e.memory_gb_per_gpu:.0f} GB")
        why = ("it needs ZeRO-3 or full recomputation to fit" if first == "memory"
               else f"{100 * share:.0f}% of the step")
        lines.append(f"   limited by {first} ({why}), then {term} "
                     f"({100 * part:.0f}%): without {term} {100 * without:.1f}%"
                     + (" (would rank first)" if i > 1 and without > best else ""))
        lines.append(f"   to shrink {term}: {REMEDIES[term]}")
    return "\n".join(lines)


def plan_main(argv) -> int:
    parser = build_plan_parser()
    args = parser.parse_args(argv)
    try:
        model, cluster = _model_and_cluster(args)
        bad = model.problems() + cluster.problems() + positive(gpus=args.gpus)
        if bad:
            raise ConfigError(*bad)
        overlap = tp_comm_overlap(args)
        if overlap is None:      # --tp-overlap, else the framework's own, else off
            overlap = True if args.tp_overlap else None if args.framework else False
        p = plan(model, cluster, args.gpus, args.seq_len, args.global_batch_tokens,
                 top=args.top, tp_overlap=overlap, headroom=args.memory_headroom,
                 framework=args.framework)
        for e in p.ranked:
            refuse_non_finite(e.as_dict(), parser, args, argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{model.name} on {args.gpus} x {cluster.name}, sequences of {args.seq_len}, "
          f"{args.global_batch_tokens:,} tokens per step, at most {p.budget_gb:.1f} GB per GPU "
          f"({100 * args.memory_headroom:g}% of HBM left free)"
          + (f", every layout under {args.framework}" if args.framework else ""))
    print(format_plan(p, cluster, args.framework))
    if p.ranked:
        print(f"band: {band_note(args.framework)}")
    return 0


def constants_main(argv) -> int:
    """`python -m minipar.costmodel constants [--json]`: every constant, its value, unit and
    source."""
    p = argparse.ArgumentParser(prog="python -m minipar.costmodel constants",
                                description="Every constant of the cost model with its source.")
    p.add_argument("--json", action="store_true", help="one JSON list of {name, value, unit, source}")
    args = p.parse_args(argv)
    rows = [{"name": c.name, "value": c.value, "unit": c.unit, "source": c.source} for c in all_constants().values()]
    if args.json:
        print(json.dumps(rows, indent=1, allow_nan=False))
        return 0
    for r in rows:
        print(f"{r['name']:24s} {r['value']:>10g} {r['unit']:20s} {r['source']}")
    return 0


@quiet_on_closed_pipe
@exit_1_on_damaged_data
def main(argv=None) -> int:
    """`python -m minipar.costmodel [flags]` predicts one step; `... plan [flags]` ranks
    layouts (`planner.main`); `... constants [--json]` lists the constants."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:
        return plan_main(argv[1:])
    if argv[:1] == ["constants"]:
        return constants_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.preset_notes = apply_preset_layout(args, argv)
    try:
        model, cluster, parallel, work = config_from_args(args)
        name = args.framework or PRESET_FRAMEWORK.get(args.preset)
        pc, precision, eff = parallel, PRECISIONS[args.precision], LLAMA3_EFFICIENCY
        if name is not None:
            if args.framework is None:
                args.notes.append(f"chose --framework {name} (the preset's own stack)")
            pc, precision, eff = apply(FRAMEWORKS[name], model, parallel, precision,
                                       tp_comm_overlap(args))
        given = {k: getattr(parallel, k) for k, flag in (("zero", "--zero"), ("bucket_mb", "--bucket-mb"),
                                                         ("tp_overlap", "--tp-overlap"))
                 if any(a == flag or a.startswith(flag + "=") for a in argv)}
        e = estimate(model, pc.replace(**given), cluster, work.seq_len, global_batch=work.global_batch,
                     microbatch_size=work.microbatch_size, recompute=work.recompute,
                     recompute_layers=work.recompute_layers, precision=precision, efficiency=eff,
                     moe_imbalance=work.moe_imbalance)
        refuse_non_finite(e.as_dict(), parser, args, argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    band = mfu_band(e.mfu, name)
    if args.json:
        print(json.dumps({**e.as_dict(), "mfu_band": list(band), "defaults_chosen": args.notes},
                         allow_nan=False))
    else:
        print(format_estimate(e, model, cluster, band, band_note(name)))
        for note in args.notes:
            print(f"default  {note}")
    return 0
