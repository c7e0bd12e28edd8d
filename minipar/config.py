"""What to train and how to split it: `ModelConfig`, `ParallelConfig`, `TrainConfig`.

Chapter "From a laptop to a cluster" (and every axis chapter for its own knobs). All three
are plain dataclasses, so the cost model, the book and the tests can reason about a run
without starting a process. Each default is written once, here, with its help text: the
command line of `python -m minipar.train` is generated from these fields (`add_flags`,
`from_flags`). `problems()` are the rules a configuration must obey; the CLI checks them
before any rank is launched.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable


class ConfigError(ValueError):
    """A configuration breaks a rule. The message names the flag (or field) and the rule."""


def opt(default, help: str, **argparse_kw):
    """A field that is also a command-line flag, `--name-with-dashes`, typed by its default
    (give `type=` when the default is None). A bool is a switch; `flag="--no-x"` turns a
    True default off."""
    return field(default=default, metadata={"help": help, **argparse_kw})


def add_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per `opt` field of dataclass `cls`, with its default and help."""
    for f in fields(cls):
        meta = dict(f.metadata)
        if "help" not in meta:
            continue
        name = meta.pop("flag", "--" + f.name.replace("_", "-"))
        if isinstance(f.default, bool):
            action = "store_false" if f.default else "store_true"
            parser.add_argument(name, dest=f.name, action=action, default=f.default, **meta)
        else:
            meta.setdefault("type", type(f.default))
            parser.add_argument(name, dest=f.name, default=f.default, **meta)


def from_flags(cls, ns: argparse.Namespace, **extra):
    """The dataclass `cls` from parsed flags (its `opt` fields) and `extra` fields."""
    given = {f.name: getattr(ns, f.name) for f in fields(cls) if "help" in f.metadata}
    return cls(**given, **extra)


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

    n_layers: int = 8
    dim: int = 64
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_dim: int = 128
    vocab_size: int = 256
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    # Llama 3.1's long-context RoPE (Hugging Face `rope_type: "llama3"`): the low frequencies
    # slowed down by rope_factor, the high ones kept, a ramp between; rope_factor 1 = plain RoPE
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    name: str = "custom"

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def problems(self) -> list[str]:
        """Rules of the architecture itself, independent of any layout."""
        out = []
        for f in ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"):
            if getattr(self, f) <= 0:
                out.append(f"{f}={getattr(self, f)} must be positive")
        if out:
            return out
        if self.dim % self.n_heads:
            out.append(f"dim={self.dim} must be divisible by n_heads={self.n_heads}")
        elif self.head_dim % 2:
            out.append(f"head_dim={self.head_dim} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            out.append(f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}")
        return out

    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        if name not in PRESETS:
            raise ConfigError(f"--model {name!r} is unknown; choose one of {', '.join(PRESETS)}")
        return PRESETS[name]

    @classmethod
    def from_hf(cls, hf: dict, source: str = "config.json") -> "ModelConfig":
        """Build from the keys of a Hugging Face `LlamaConfig` (its `to_dict()` or config.json).
        A field this model does not implement is a `ConfigError` naming it (`hf_problems`):
        better no run than a quiet run of another model."""
        out = hf_problems(hf)
        if out:
            raise ConfigError(f"{source}: {'; '.join(out)}")
        heads = hf["num_attention_heads"]
        return cls(
            n_layers=hf["num_hidden_layers"],
            dim=hf["hidden_size"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            ffn_dim=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(hf_rope(hf).get("rope_theta", 10000.0)),
            **llama3_rope_fields(hf_rope(hf)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            name=hf.get("_name_or_path") or "hf",
        )

    @classmethod
    def from_hf_dir(cls, path: str) -> "ModelConfig":
        """The model of a Hugging Face directory, from its config.json (`--init-hf DIR`)."""
        file = os.path.join(path, "config.json")
        if not os.path.isdir(path):
            raise ConfigError(f"--init-hf {path}: no such directory")
        try:
            with open(file) as f:
                hf = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"--init-hf {path}: no config.json in the directory") from None
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"--init-hf {file}: unreadable: {str(e).splitlines()[0]}") from None
        return cls.from_hf(hf, source=f"--init-hf {file}")

    def to_hf(self) -> dict:
        """The inverse of `from_hf`: keys a Hugging Face `LlamaConfig(**d)` accepts."""
        return dict(
            num_hidden_layers=self.n_layers, hidden_size=self.dim,
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv_heads,
            intermediate_size=self.ffn_dim, vocab_size=self.vocab_size,
            max_position_embeddings=self.max_seq_len, rope_theta=self.rope_theta,
            rms_norm_eps=self.norm_eps, tie_word_embeddings=self.tie_embeddings,
            hidden_act="silu", attention_bias=False, mlp_bias=False,
            rope_scaling=None if self.llama3_rope is None else dict(
                rope_type="llama3", factor=self.rope_factor,
                low_freq_factor=self.rope_low_freq_factor,
                high_freq_factor=self.rope_high_freq_factor,
                original_max_position_embeddings=self.rope_original_max_len),
        )

    @property
    def llama3_rope(self) -> tuple[float, float, float, int] | None:
        """(factor, low_freq_factor, high_freq_factor, original context) or None: plain RoPE."""
        if self.rope_factor == 1.0:
            return None
        return (self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor,
                self.rope_original_max_len)


# The Hugging Face config.json fields that must be present, and the values minipar's Llama
# implements of those that change the architecture. Anything else is another model.
HF_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
               "vocab_size")
HF_SUPPORTED = {
    "model_type": ("llama",),
    "hidden_act": ("silu",),                # SwiGLU's gate
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "attention_dropout": (0, 0.0),          # minipar has no dropout
}


def hf_rope(hf: dict) -> dict:
    """The rotary embedding's parameters: transformers 5's `rope_parameters`, or the older
    top-level `rope_theta` and `rope_scaling`."""
    rope = dict(hf.get("rope_parameters") or {})
    if hf.get("rope_scaling"):
        rope = {**hf["rope_scaling"], **rope}
    if "rope_theta" in hf and "rope_theta" not in rope:
        rope["rope_theta"] = hf["rope_theta"]
    return rope


LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")


def llama3_rope_fields(rope: dict) -> dict:
    """ModelConfig's fields for Llama 3.1's RoPE scaling, from Hugging Face's parameters."""
    if rope.get("rope_type", rope.get("type")) != "llama3":
        return {}
    return dict(rope_factor=float(rope["factor"]),
                rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_len=int(rope["original_max_position_embeddings"]))


def hf_problems(hf: dict) -> list[str]:
    """Each field of a Hugging Face Llama config that this model does not implement."""
    out = [f"missing field {k!r}" for k in HF_REQUIRED if k not in hf]
    for key, allowed in HF_SUPPORTED.items():
        if key in hf and hf[key] not in allowed:
            out.append(f"{key}={hf[key]!r} is not supported (minipar's Llama has {allowed[0]!r})")
    arch = hf.get("architectures")
    if arch and arch != ["LlamaForCausalLM"]:
        out.append(f"architectures={arch} is not supported (only LlamaForCausalLM)")
    rope_type = hf_rope(hf).get("rope_type", hf_rope(hf).get("type", "default"))
    if rope_type not in ("default", "llama3"):
        out.append(f"rope_scaling: rope_type={rope_type!r} is not supported (plain RoPE, or "
                   "Llama 3.1's 'llama3')")
    elif rope_type == "llama3":
        out += [f"rope_scaling: rope_type 'llama3' needs {k!r}" for k in LLAMA3_ROPE_KEYS
                if k not in hf_rope(hf)]
    if "hidden_size" in hf and "num_attention_heads" in hf and hf.get("head_dim") not in (None, hf["hidden_size"] // hf["num_attention_heads"]):
        out.append(f"head_dim={hf['head_dim']} is not supported: minipar's is hidden_size / "
                   f"num_attention_heads = {hf['hidden_size'] // hf['num_attention_heads']}")
    return out


# `tiny` is sized for a 2-core laptop and chosen so that every layout with tp, cp, pp, dp in
# {1, 2, 4} and pp * virtual_stages <= 8 is valid: 8 layers, 8 query and 4 KV heads, FFN and
# vocabulary divisible by 4. Its vocabulary is 256 so that `--data` can train on raw bytes.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(name="tiny"),
    # Llama 3.2 1B's config.json (1.24B parameters, embeddings tied): the ~1B model the GPU
    # benchmarks train. Its 131072 positions come from rope_scaling "llama3": factor 32 over
    # the 8192 it was pretrained at (low/high frequency factors 1 and 4).
    "llama3.2-1b": ModelConfig(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                               vocab_size=128256, max_seq_len=131072, rope_theta=500000.0,
                               rope_factor=32.0, rope_low_freq_factor=1.0,
                               rope_high_freq_factor=4.0, rope_original_max_len=8192,
                               tie_embeddings=True, name="llama3.2-1b"),
    "llama3-8b": ModelConfig(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                             vocab_size=128256, max_seq_len=8192, rope_theta=500000.0,
                             name="llama3-8b"),
    "llama3-70b": ModelConfig(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                              vocab_size=128256, max_seq_len=8192, rope_theta=500000.0,
                              name="llama3-70b"),
    "llama3-405b": ModelConfig(n_layers=126, dim=16384, n_heads=128, n_kv_heads=8,
                               ffn_dim=53248, vocab_size=128256, max_seq_len=8192,
                               rope_theta=500000.0, name="llama3-405b"),
}

SCHEDULES = ("afab", "1f1b", "interleaved", "zb")
CP_IMPLS = ("ring", "allgather", "ulysses")
RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class ParallelConfig:
    """How one training job is split: degrees of the four axes and the knobs of each.

    The order of the axes, innermost (fastest-varying rank) first, is Llama 3's:
    [TP, CP, PP, DP]. `world_size` is their product.
    """

    tp: int = opt(1, "tensor-parallel degree (innermost)")
    cp: int = opt(1, "context-parallel degree")
    pp: int = opt(1, "pipeline-parallel degree")
    dp: int = opt(1, "data-parallel degree (outermost)")
    zero: int = opt(0, "ZeRO stage: 0 plain DP, 1 shard the optimizer state, 2 + gradients, "
                       "3 + parameters")
    bucket_mb: float = opt(25.0, "gradient bucket size in MB; 0 = naive: one all-reduce per "
                                 "gradient after backward")
    sp: bool = opt(False, "sequence parallelism (with --tp > 1)")
    tp_overlap: bool = opt(False, "collective matmul: SP's all-gather and reduce-scatter cut "
                                  "into ring steps hidden behind the matmuls (with --sp)")
    schedule: str = opt("1f1b", f"pipeline schedule: {', '.join(SCHEDULES)}")
    virtual_stages: int = opt(1, "model chunks per pipeline rank (--schedule interleaved)")
    microbatches: int | None = opt(None, "micro-batches per DP rank per step (default: "
                                         "--pp with --schedule interleaved, else 1)", type=int)
    cp_impl: str = opt("ring", f"context-parallel attention: {' or '.join(CP_IMPLS)}")
    recompute: str = opt("none", "activation recomputation: none, selective (the attention "
                                 "core) or full (each block from its input)",
                         choices=RECOMPUTE_MODES)

    def __post_init__(self):
        # The default every schedule accepts: interleaved wants a multiple of --pp.
        if self.microbatches is None:
            m = self.pp if self.schedule == "interleaved" and self.pp > 1 else 1
            object.__setattr__(self, "microbatches", m)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def problems(self, model: ModelConfig, seq_len: int, global_batch: int) -> list[str]:
        """Every rule this layout breaks for this model and batch, one line each."""
        out = self._count_problems(seq_len, global_batch)
        if out:
            return out
        return (self._choice_problems() + self._tensor_problems(model, seq_len)
                + self._batch_problems(model, seq_len, global_batch)
                + self._pipeline_problems(model))

    def _count_problems(self, seq_len: int, global_batch: int) -> list[str]:
        counts = {f"--{f}": getattr(self, f) for f in ("tp", "cp", "pp", "dp")}
        counts.update({"--microbatches": self.microbatches,
                       "--virtual-stages": self.virtual_stages,
                       "--seq-len": seq_len, "--global-batch": global_batch})
        return [f"{flag} {n} must be a positive integer" for flag, n in counts.items() if n < 1]

    def _choice_problems(self) -> list[str]:
        out = []
        if self.zero not in (0, 1, 2, 3):
            out.append(f"--zero {self.zero} is unknown; choose 0, 1, 2 or 3")
        if not 0 <= self.bucket_mb < math.inf:     # `nan < 0` is False: ask the positive
            out.append(f"--bucket-mb {self.bucket_mb} must be >= 0 (0 = naive all-reduce)")
        if self.schedule not in SCHEDULES:
            out.append(f"--schedule {self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        if self.cp_impl not in CP_IMPLS:
            out.append(f"--cp-impl {self.cp_impl!r} is unknown; choose one of {', '.join(CP_IMPLS)}")
        if self.recompute not in RECOMPUTE_MODES:
            out.append(f"--recompute {self.recompute!r} is unknown; choose one of {', '.join(RECOMPUTE_MODES)}")
        return out

    def _tensor_problems(self, m: ModelConfig, seq_len: int) -> list[str]:
        out = [f"--tp {self.tp} does not divide {name}={getattr(m, name)}"
               for name in ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
               if getattr(m, name) % self.tp]
        if self.sp and self.tp == 1:
            out.append("--sp needs --tp > 1 (sequence parallelism shards along the TP group)")
        if self.cp > 1 and seq_len % (2 * self.cp):
            out.append(f"--cp {self.cp} needs --seq-len divisible by 2*cp={2 * self.cp} "
                       f"(load-balanced causal chunks); got {seq_len}")
        elif self.sp and self.tp > 1 and (seq_len // self.cp) % self.tp:
            what = f"--seq-len {seq_len}" if self.cp == 1 else \
                f"the per-CP-rank sequence {seq_len // self.cp}"
            out.append(f"--sp needs {what} divisible by --tp {self.tp} (each TP rank keeps a "
                       "slice of the sequence)")
        if self.tp_overlap and not self.sp:
            out.append("--tp-overlap needs --sp (it overlaps SP's all-gather and reduce-scatter)")
        if self.tp_overlap and self.pp > 1 and self.schedule == "zb":
            out.append("--tp-overlap does not combine with --schedule zb (W would rerun the "
                       "ring of each collective matmul)")
        return out + self._ulysses_problems(m)

    def _ulysses_problems(self, m: ModelConfig) -> list[str]:
        """Ulysses trades sequence shards for head shards: each CP rank gets 1/cp of the
        TP rank's heads. KV heads fewer than cp are replicated (GQA), if cp is a multiple."""
        if self.cp_impl != "ulysses" or self.cp == 1 or m.n_heads % self.tp or m.n_kv_heads % self.tp:
            return []
        out, kv = [], m.n_kv_heads // self.tp
        if m.n_heads % (self.cp * self.tp):
            out.append(f"--cp-impl ulysses needs n_heads={m.n_heads} divisible by cp*tp="
                       f"{self.cp * self.tp} (each rank attends with a share of the heads)")
        if kv % self.cp and self.cp % kv:
            out.append(f"--cp-impl ulysses needs the KV heads per TP rank ({kv}) divisible by "
                       f"--cp {self.cp}, or --cp a multiple of them (to replicate them)")
        return out

    def _batch_problems(self, m: ModelConfig, seq_len: int, global_batch: int) -> list[str]:
        out = []
        if seq_len > m.max_seq_len:
            out.append(f"--seq-len {seq_len} exceeds the model's max_seq_len={m.max_seq_len}")
        if global_batch % (self.dp * self.microbatches):
            out.append(f"--global-batch {global_batch} is not divisible by dp*microbatches="
                       f"{self.dp}*{self.microbatches}={self.dp * self.microbatches}"
                       + (f" (--microbatches defaults to --pp {self.pp} with --schedule "
                          "interleaved)" if self.schedule == "interleaved" and
                          self.microbatches == self.pp > 1 else ""))
        return out

    def _pipeline_problems(self, m: ModelConfig) -> list[str]:
        out = []
        if self.virtual_stages > 1 and self.schedule not in ("interleaved",):
            out.append(f"--virtual-stages {self.virtual_stages} needs --schedule interleaved "
                       f"(schedule {self.schedule!r} has one chunk per rank)")
        if m.n_layers < self.pp * self.virtual_stages:
            out.append(f"--pp {self.pp} x --virtual-stages {self.virtual_stages} = "
                       f"{self.pp * self.virtual_stages} stages exceeds n_layers={m.n_layers}")
        if self.pp > 1 and self.schedule == "interleaved" and self.microbatches % self.pp:
            out.append(f"--schedule interleaved needs --microbatches ({self.microbatches}) "
                       f"to be a multiple of --pp {self.pp}")
        if self.virtual_stages > 1 and self.pp == 1:
            out.append(f"--virtual-stages {self.virtual_stages} needs --pp > 1 "
                       "(the chunks go round the pipeline ranks)")
        return out

    def validate(self, model: ModelConfig, seq_len: int, global_batch: int) -> "ParallelConfig":
        """Raise `ConfigError` listing every broken rule; return self when all hold."""
        out = model.problems() + self.problems(model, seq_len, global_batch)
        if out:
            raise ConfigError("; ".join(out))
        return self

    def replace(self, **kw) -> "ParallelConfig":
        return replace(self, **kw)

    def as_dict(self) -> dict:
        return asdict(self)


DTYPES = ("auto", "fp32", "bf16")
MAX_LR = 1.0   # AdamW steps each weight by ~lr: beyond 1 no run learns, it only diverges


@dataclass
class TrainConfig:
    """Everything one run needs; the CLI fills it from its flags, tests and notebooks build
    it directly."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: str = opt("tiny", f"model preset: {', '.join(PRESETS)}")
    global_batch: int = opt(8, "sequences per optimizer step, all ranks together")
    seq_len: int = opt(32, "tokens per sequence")
    steps: int = opt(10, "optimizer steps in total")
    seed: int = opt(0, "the seed of the weights and of the synthetic data")
    lr: float = opt(3e-3, "peak learning rate")
    warmup_steps: int = opt(10, "steps of linear warmup")
    decay_steps: int = opt(1000, "length of the cosine decay after warmup")
    min_lr_ratio: float = opt(0.1, "the decay's floor, as a fraction of --lr")
    weight_decay: float = opt(0.1, "AdamW's decoupled weight decay (matrices only)")
    clip: float = opt(1.0, "global gradient-norm clip (0 = off)")
    data: str | None = opt(None, "train on this text file: as bytes, or with --init-hf's "
                                 "tokenizer.json (default: synthetic)", type=str)
    init_hf: str | None = opt(None, "start from a Hugging Face Llama directory (config.json + "
                                    "safetensors): its shape replaces --model's", type=str)
    export_hf: str | None = opt(None, "at the end, write the model as a Hugging Face Llama "
                                      "directory (config.json + model.safetensors)", type=str)
    log_json: str | None = opt(None, "write one JSON object per step (JSON Lines)", type=str)
    trace: str | None = opt(None, "write each rank's pipeline events as JSON (the pipeline "
                                  "chapter's own format; --profile writes the full trace)", type=str)
    profile: str | None = opt(None, "write one Chrome/Perfetto trace of the whole job to "
                                    "DIR/trace.json (open it in ui.perfetto.dev) and print how "
                                    "much communication was hidden", type=str)
    dtype: str = opt("auto", "auto (bf16 autocast on CUDA, fp32 on CPU), fp32 or bf16")
    timeout_s: float = opt(60.0, "collective timeout: a dead peer fails within it")
    save: str | None = opt(None, "checkpoint directory (DIR/step_000010, DIR/latest)", type=str)
    save_every: int = opt(0, "checkpoint every K steps (0: only at the end)")
    resume: str | None = opt(None, "resume from a checkpoint, or from a --save DIR's latest; "
                                   "any layout", type=str)
    fail_at_step: int | None = opt(None, "teaching: kill --fail-rank at this step", type=int)
    fail_rank: int | None = opt(None, "the rank --fail-at-step kills (default 0)", type=int)
    max_restarts: int = opt(0, "on a failure, restart from --save's latest checkpoint, "
                               "up to N times")
    skip_nonfinite: bool = opt(False, "a step whose loss or gradient norm is NaN or inf is "
                                      "skipped (no update) instead of stopping the run, exit 1, "
                                      "naming the step (the default)")
    stop_grace_s: float = opt(30.0, "on SIGTERM (Ctrl-C: at most 5), the seconds the ranks "
                                    "get to finish their step and (with --save) checkpoint "
                                    "before they are killed")
    resume_allow_change: bool = opt(False, "let --resume continue with another --seq-len, "
                                           "--global-batch, --data or --seed than the "
                                           "checkpoint's (the log records the change)")
    progress: bool = opt(True, "no tqdm bar", flag="--no-progress")
    peak_flops: float | None = None   # the device's peak, for MFU (measured when None)
    # Called on every rank as after_backward(step, chunks, dp, grid) once the step's
    # gradients are reduced, before clipping; what it returns (when not None) comes back in
    # that rank's result under "probes", by step. Tests read gradients this way.
    after_backward: Callable | None = None

    def model_config(self) -> ModelConfig:
        if self.init_hf:      # a Hugging Face directory brings its own shape
            return ModelConfig.from_hf_dir(self.init_hf)
        return ModelConfig.preset(self.model)

    def problems(self) -> list[str]:
        """The rules of the run itself (the layout's are ParallelConfig's)."""
        out = [f"--{n.replace('_', '-')} {getattr(self, n)} must be >= 0"
               for n in ("steps", "warmup_steps", "decay_steps") if getattr(self, n) < 0]
        if self.dtype not in DTYPES:
            out.append(f"--dtype {self.dtype!r} is unknown; choose {', '.join(DTYPES)}")
        return out + self._number_problems() + self._fault_problems()

    def _number_problems(self) -> list[str]:
        """Each real-valued flag finite and in its range. Written `not lo <= x <= hi`, never
        `x < lo`: NaN compares False with everything, so `nan < 0` would let it through."""
        rules = [  # flag, value, ok, the rule
            ("--lr", self.lr, 0 < self.lr <= MAX_LR,
             f"must be in (0, {MAX_LR:g}]: AdamW moves every weight by about lr per step"),
            ("--weight-decay", self.weight_decay, 0 <= self.weight_decay < math.inf,
             "must be finite and >= 0"),
            ("--min-lr-ratio", self.min_lr_ratio, 0 <= self.min_lr_ratio <= 1,
             "must be in [0, 1] (a fraction of --lr)"),
            ("--clip", self.clip, 0 <= self.clip < math.inf, "must be finite and >= 0 (0 = off)"),
            ("--timeout-s", self.timeout_s, 0 < self.timeout_s < math.inf,
             "must be finite and positive"),
            ("--stop-grace-s", self.stop_grace_s, 0 <= self.stop_grace_s < math.inf,
             "must be finite and >= 0"),
        ]
        return [f"{flag} {value} {rule}" for flag, value, ok, rule in rules if not ok]

    def _fault_problems(self) -> list[str]:
        out = []
        if self.fail_rank is not None and self.fail_at_step is None:
            out.append(f"--fail-rank {self.fail_rank} needs --fail-at-step K")
        if self.fail_at_step is not None and not 0 <= self.fail_at_step < self.steps:
            out.append(f"--fail-at-step {self.fail_at_step} must be a step of the run: "
                       f"0..{self.steps - 1} (--steps {self.steps})")
        rank, n = self.fail_rank or 0, self.parallel.world_size
        if self.fail_at_step is not None and not 0 <= rank < n:
            out.append(f"--fail-rank {rank} is not a rank of this layout (0..{n - 1})")
        if self.max_restarts < 0:
            out.append(f"--max-restarts {self.max_restarts} must be >= 0")
        if self.max_restarts and not self.save:
            out.append(f"--max-restarts {self.max_restarts} needs --save DIR: "
                       "a restart resumes from its latest checkpoint")
        return out

    def validate(self) -> "TrainConfig":
        """Raise `ConfigError` listing every broken rule (model, layout, run)."""
        self.parallel.validate(self.model_config(), self.seq_len, self.global_batch)
        out = self.problems()
        if out:
            raise ConfigError("; ".join(out))
        return self
