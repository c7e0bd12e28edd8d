"""What to train and how to split it: `ModelConfig` and `ParallelConfig`.

Both are plain dataclasses so that the cost model, the book and the tests can reason about a
configuration without starting a single process. `ParallelConfig.validate()` is the one place
that knows the rules a layout must obey; the CLI calls it before any rank is launched.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


class ConfigError(ValueError):
    """A configuration breaks a rule. The message names the flag (or field) and the rule."""


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

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0                 # 0: plain DP, 1: shard optimizer, 2: + grads, 3: + params
    bucket_mb: float = 25.0       # 0 = naive: one all-reduce per gradient after backward
    sp: bool = False              # sequence parallelism (needs tp > 1)
    schedule: str = "1f1b"        # pipeline schedule (pp > 1)
    virtual_stages: int = 1       # model chunks per pipeline rank (interleaved)
    microbatches: int = 1         # micro-batches per DP rank per step
    cp_impl: str = "ring"

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def problems(self, model: ModelConfig, seq_len: int, global_batch: int) -> list[str]:
        """Every rule this layout breaks for this model and batch, one line each."""
        out = []
        for flag in ("tp", "cp", "pp", "dp"):
            if getattr(self, flag) < 1:
                out.append(f"--{flag} {getattr(self, flag)} must be a positive integer")
        if self.microbatches < 1:
            out.append(f"--microbatches {self.microbatches} must be a positive integer")
        if self.virtual_stages < 1:
            out.append(f"--virtual-stages {self.virtual_stages} must be a positive integer")
        if seq_len < 1:
            out.append(f"--seq-len {seq_len} must be a positive integer")
        if global_batch < 1:
            out.append(f"--global-batch {global_batch} must be a positive integer")
        if out:
            return out
        if self.zero not in (0, 1, 2, 3):
            out.append(f"--zero {self.zero} is unknown; choose 0, 1, 2 or 3")
        if self.bucket_mb < 0:
            out.append(f"--bucket-mb {self.bucket_mb} must be >= 0 (0 = naive all-reduce)")
        if self.schedule not in SCHEDULES:
            out.append(f"--schedule {self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        if self.cp_impl not in CP_IMPLS:
            out.append(f"--cp-impl {self.cp_impl!r} is unknown; choose one of {', '.join(CP_IMPLS)}")
        m = model
        if m.n_heads % self.tp:
            out.append(f"--tp {self.tp} does not divide n_heads={m.n_heads}")
        if m.n_kv_heads % self.tp:
            out.append(f"--tp {self.tp} does not divide n_kv_heads={m.n_kv_heads}")
        if m.ffn_dim % self.tp:
            out.append(f"--tp {self.tp} does not divide ffn_dim={m.ffn_dim}")
        if m.vocab_size % self.tp:
            out.append(f"--tp {self.tp} does not divide vocab_size={m.vocab_size}")
        if self.sp and self.tp == 1:
            out.append("--sp needs --tp > 1 (sequence parallelism shards along the TP group)")
        if seq_len % (2 * self.cp):
            out.append(f"--cp {self.cp} needs --seq-len divisible by 2*cp={2 * self.cp} "
                       f"(load-balanced causal chunks); got {seq_len}")
        elif self.sp and (seq_len // self.cp) % self.tp:
            out.append(f"--sp needs the per-CP-rank sequence {seq_len // self.cp} divisible by --tp {self.tp}")
        if seq_len > m.max_seq_len:
            out.append(f"--seq-len {seq_len} exceeds the model's max_seq_len={m.max_seq_len}")
        if global_batch % (self.dp * self.microbatches):
            out.append(f"--global-batch {global_batch} is not divisible by dp*microbatches="
                       f"{self.dp}*{self.microbatches}={self.dp * self.microbatches}")
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
