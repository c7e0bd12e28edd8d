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
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Build from the keys of a Hugging Face `LlamaConfig` (its `to_dict()` or config.json)."""
        heads = hf["num_attention_heads"]
        return cls(
            n_layers=hf["num_hidden_layers"],
            dim=hf["hidden_size"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            ffn_dim=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            name=hf.get("_name_or_path") or "hf",
        )

    def to_hf(self) -> dict:
        """The inverse of `from_hf`: keys a Hugging Face `LlamaConfig(**d)` accepts."""
        return dict(
            num_hidden_layers=self.n_layers, hidden_size=self.dim,
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv_heads,
            intermediate_size=self.ffn_dim, vocab_size=self.vocab_size,
            max_position_embeddings=self.max_seq_len, rope_theta=self.rope_theta,
            rms_norm_eps=self.norm_eps, tie_word_embeddings=self.tie_embeddings,
            hidden_act="silu", attention_bias=False, mlp_bias=False,
        )


# `tiny` is sized for a 2-core laptop and chosen so that every layout with tp, cp, pp, dp in
# {1, 2, 4} and pp * virtual_stages <= 8 is valid: 8 layers, 8 query and 4 KV heads, FFN and
# vocabulary divisible by 4. Its vocabulary is 256 so that `--data` can train on raw bytes.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(name="tiny"),
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
CP_IMPLS = ("ring", "allgather")


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
    schedule: str = opt("1f1b", f"pipeline schedule: {', '.join(SCHEDULES)}")
    virtual_stages: int = opt(1, "model chunks per pipeline rank (--schedule interleaved)")
    microbatches: int = opt(1, "micro-batches per DP rank per step")
    cp_impl: str = opt("ring", f"context-parallel attention: {' or '.join(CP_IMPLS)}")

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
        if self.bucket_mb < 0:
            out.append(f"--bucket-mb {self.bucket_mb} must be >= 0 (0 = naive all-reduce)")
        if self.schedule not in SCHEDULES:
            out.append(f"--schedule {self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        if self.cp_impl not in CP_IMPLS:
            out.append(f"--cp-impl {self.cp_impl!r} is unknown; choose one of {', '.join(CP_IMPLS)}")
        return out

    def _tensor_problems(self, m: ModelConfig, seq_len: int) -> list[str]:
        out = [f"--tp {self.tp} does not divide {name}={getattr(m, name)}"
               for name in ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
               if getattr(m, name) % self.tp]
        if self.sp and self.tp == 1:
            out.append("--sp needs --tp > 1 (sequence parallelism shards along the TP group)")
        if seq_len % (2 * self.cp):
            out.append(f"--cp {self.cp} needs --seq-len divisible by 2*cp={2 * self.cp} "
                       f"(load-balanced causal chunks); got {seq_len}")
        elif self.sp and (seq_len // self.cp) % self.tp:
            out.append(f"--sp needs the per-CP-rank sequence {seq_len // self.cp} divisible by --tp {self.tp}")
        return out

    def _batch_problems(self, m: ModelConfig, seq_len: int, global_batch: int) -> list[str]:
        out = []
        if seq_len > m.max_seq_len:
            out.append(f"--seq-len {seq_len} exceeds the model's max_seq_len={m.max_seq_len}")
        if global_batch % (self.dp * self.microbatches):
            out.append(f"--global-batch {global_batch} is not divisible by dp*microbatches="
                       f"{self.dp}*{self.microbatches}={self.dp * self.microbatches}")
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
    data: str | None = opt(None, "train on this text file as bytes (default: synthetic)", type=str)
    log_json: str | None = opt(None, "write one JSON object per step (JSON Lines)", type=str)
    trace: str | None = opt(None, "write each rank's pipeline events as JSON", type=str)
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
    progress: bool = opt(True, "no tqdm bar", flag="--no-progress")
    peak_flops: float | None = None   # the device's peak, for MFU (measured when None)
    # Called on every rank as after_backward(step, chunks, dp, grid) once the step's
    # gradients are reduced, before clipping; what it returns (when not None) comes back in
    # that rank's result under "probes", by step. Tests read gradients this way.
    after_backward: Callable | None = None

    def model_config(self) -> ModelConfig:
        return ModelConfig.preset(self.model)

    def problems(self) -> list[str]:
        """The rules of the run itself (the layout's are ParallelConfig's)."""
        out = [f"--{n.replace('_', '-')} {getattr(self, n)} must be >= 0"
               for n in ("steps", "warmup_steps", "decay_steps") if getattr(self, n) < 0]
        if self.lr <= 0:
            out.append(f"--lr {self.lr} must be positive")
        if self.dtype not in DTYPES:
            out.append(f"--dtype {self.dtype!r} is unknown; choose {', '.join(DTYPES)}")
        if self.timeout_s <= 0:
            out.append(f"--timeout-s {self.timeout_s} must be positive")
        return out + self._fault_problems()

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
