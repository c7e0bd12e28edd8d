"""What to train and how to split it: `ModelConfig`, `ParallelConfig`, `TrainConfig`.

Chapter "One model, sixteen thousand GPUs". Three plain dataclasses, so that the cost model,
the book and the tests can reason about a run without starting a process. A reader meets
them one at a time: the model's shape (`ModelConfig` and its presets, Llama 3 405B among
them) here, beside the Llama it describes; the layout (`ParallelConfig`: the degree of each
of the four axes and each axis's knobs) in "Four dimensions at once", once every axis has
had its chapter; the run's own flags (`TrainConfig`: steps, learning rate, files, restarts)
in "From a laptop to a cluster".

Each default is written once, here, with its help text (`opt`): `cli.py` generates the
command lines from these fields. `problems()` are the rules a configuration must obey, each
written once and returned as `Problem`s: the line a user reads, with the flag it names and
the rule's name for code that must tell rules apart. The command line refuses a run that
breaks one, in one line, before any rank starts.
"""

import math
from dataclasses import asdict, dataclass, field, replace


class Problem(str):
    """One broken rule. A `Problem` *is* the line a user reads (a str: it prints, joins and
    compares as that line), and carries what code may ask instead of reading the words: the
    `flag` it names, the `rule` (a short name) and the `values` it compared."""

    def __new__(cls, line: str, flag: str = "", rule: str = "", **values):
        self = super().__new__(cls, line)
        self.flag, self.rule, self.values = flag, rule, values
        return self


class ConfigError(ValueError):
    """A configuration breaks one rule or more: its message is their lines joined by "; ",
    each naming the flag (or field) and the rule; `problems` holds them one by one (they are
    the exception's args: `ConfigError(*problems)`)."""

    @property
    def problems(self) -> list[str]:
        return list(self.args)

    def __str__(self) -> str:
        return "; ".join(self.args)


def opt(default, help: str, **argparse_kw):
    """A field that is also a command-line flag, `--name-with-dashes`, typed by its default
    (a string when the default is None, unless `type=` says otherwise). A bool is a switch;
    `flag="--no-x"` turns a True default off. `cli.add_flags` reads these."""
    return field(default=default, metadata={"help": help, **argparse_kw})


def flag_of(name: str) -> str:
    """The flag of a field: `virtual_stages` -> `--virtual-stages`."""
    return "--" + name.replace("_", "-")


def positive(**counts: int) -> list[Problem]:
    """Each count (named by its field) below 1."""
    return [Problem(f"{flag_of(k)} {n} must be a positive integer", flag_of(k), "positive",
                    **{k: n}) for k, n in counts.items() if n < 1]


def broken(rules) -> list[Problem]:
    """The rules that do not hold, from a table: one row per rule, (broken?, flag, rule, the
    line a user reads)."""
    return [Problem(line, flag, rule) for bad, flag, rule, line in rules if bad]


def refuse(problems: list[Problem]) -> None:
    """Raise `ConfigError` listing `problems`, if there are any."""
    if problems:
        raise ConfigError(*problems)


def unknown(flag: str, value, choices) -> Problem:
    """A value outside its vocabulary."""
    return Problem(f"{flag} {value!r} is unknown; choose one of {', '.join(map(str, choices))}",
                   flag, "unknown", value=value)


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU. The cost model
    also prices the two-matrix MLPs of GPT-3 and Nemotron (`mlp`); the trainer builds SwiGLU."""

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
    # "swiglu": down(silu(gate x) * up x), three matrices; "gelu" (GPT-3, BLOOM, OPT) and
    # "relu2" (squared ReLU, Nemotron-4): down(act(up x)), two
    mlp: str = "swiglu"
    # Mixture-of-experts (the experts chapter): moe_experts routed SwiGLU experts of hidden
    # size moe_ffn_dim (0: ffn_dim) in every layer from moe_first_layer on, each token sent to
    # moe_top_k of them by a router scoring with softmax or sigmoid (DeepSeek-V3), plus
    # moe_shared_experts that every token passes through. moe_experts 0 = dense.
    # moe_capacity_factor 0 = dropless; C > 0 keeps, per sequence of T tokens and expert, the
    # ceil(C * T * k / E) earliest. moe_max_nodes (0: no limit) is DeepSeek-V3's node-limited
    # routing (the cost model's; the trainer routes without it). Balancing: moe_bias_rate moves
    # the per-expert routing bias after each step (DeepSeek-V3's gamma, 0: off), moe_aux_loss
    # weighs the sequence-wise balance loss (its alpha, 0: off).
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_shared_experts: int = 0
    moe_ffn_dim: int = 0
    moe_first_layer: int = 0
    moe_score: str = "softmax"
    moe_capacity_factor: float = 0.0
    moe_max_nodes: int = 0
    moe_bias_rate: float = 0.0
    moe_aux_loss: float = 0.0
    name: str = "custom"

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def llama3_rope(self) -> tuple[float, float, float, int] | None:
        """(factor, low_freq_factor, high_freq_factor, original context) or None: plain RoPE."""
        scaled = (self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor,
                  self.rope_original_max_len)
        return None if self.rope_factor == 1.0 else scaled

    @property
    def is_moe(self) -> bool:
        return self.moe_experts > 0

    @property
    def expert_ffn_dim(self) -> int:
        return self.moe_ffn_dim or self.ffn_dim

    @property
    def mixtral(self) -> bool:
        """Experts as Mixtral's, which a Hugging Face Mixtral directory holds: in every layer,
        scored by a softmax (its top k renormalised: `MoE.route`), none shared."""
        return self.is_moe and (self.moe_first_layer, self.moe_shared_experts,
                                self.moe_score) == (0, 0, "softmax")

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP: a gated one has two going in, the others one."""
        return 3 if self.mlp == "swiglu" else 2

    def problems(self) -> list[Problem]:
        """Rules of the architecture itself, independent of any layout."""
        sizes = ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
        out = broken((getattr(self, k) <= 0, k, "positive", f"{k}={getattr(self, k)} must be "
                      "positive") for k in sizes)
        return out or self.expert_problems() or broken([
            (self.mlp not in MLPS, "mlp", "choices", f"mlp={self.mlp!r} must be one of {', '.join(MLPS)}"),
            (self.dim % self.n_heads, "dim", "heads",
             f"dim={self.dim} must be divisible by n_heads={self.n_heads}"),
            (not self.dim % self.n_heads and self.head_dim % 2, "dim", "rope",
             f"head_dim={self.head_dim} must be even for RoPE"),
            (self.n_heads % self.n_kv_heads, "n_kv_heads", "groups",
             f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}")])

    def expert_problems(self) -> list[Problem]:
        """The mixture of experts' rules, each named by its flag (`TrainConfig`'s)."""
        e, k = self.moe_experts, self.moe_top_k
        sizes = [f"moe_{f}" for f in ("experts", "shared_experts", "ffn_dim", "first_layer",
                                      "max_nodes", "capacity_factor", "aux_loss", "bias_rate")]
        return broken([(not 0 <= getattr(self, f) < math.inf, flag_of(f), "range", f"{flag_of(f)} "
                        f"{getattr(self, f)} must be finite and >= 0") for f in sizes] + [
            (e > 0 and not 1 <= k <= e, "--moe-top-k", "top-k", f"--moe-top-k {k} must be "
             f"between 1 and --moe-experts {e} (each token picks k different experts)"),
            (e > 0 and self.moe_score not in MOE_SCORES, "--moe-score", "choices",
             f"moe_score={self.moe_score!r} must be one of {', '.join(MOE_SCORES)}")])

    @classmethod
    def preset(cls, name: str, flag: str = "--model") -> "ModelConfig":
        if name not in PRESETS:
            raise ConfigError(unknown(flag, name, PRESETS))
        return PRESETS[name]


# `tiny` is sized for a 2-core laptop and chosen so that every layout with tp, cp, pp, dp in
# {1, 2, 4} and pp * virtual_stages <= 8 is valid: 8 layers, 8 query and 4 KV heads, FFN and
# vocabulary divisible by 4. Its vocabulary is 256 so that `--data` can train on raw bytes.
# What every Llama 3 shares: 8 KV heads, the 128256-token vocabulary, RoPE base 500000 and
# 8192 positions; each preset below replaces the rest.
LLAMA3_SHARED = ModelConfig(n_kv_heads=8, vocab_size=128256, max_seq_len=8192, rope_theta=500000.0)
PRESETS: dict[str, ModelConfig] = {name: replace(model, name=name) for name, model in {
    "tiny": ModelConfig(),
    # Llama 3.2 1B's config.json (1.24B parameters, embeddings tied): the ~1B model the GPU
    # benchmarks train. Its 131072 positions come from rope_scaling "llama3": factor 32 over
    # the 8192 it was pretrained at (low/high frequency factors 1 and 4: the defaults).
    "llama3.2-1b": replace(LLAMA3_SHARED, n_layers=16, dim=2048, n_heads=32, ffn_dim=8192,
                           max_seq_len=131072, rope_factor=32.0, tie_embeddings=True),
    "llama3-8b": replace(LLAMA3_SHARED, n_layers=32, dim=4096, n_heads=32, ffn_dim=14336),
    "llama3-70b": replace(LLAMA3_SHARED, n_layers=80, dim=8192, n_heads=64, ffn_dim=28672),
    "llama3-405b": replace(LLAMA3_SHARED, n_layers=126, dim=16384, n_heads=128, ffn_dim=53248),
    # Mixtral 8x7B's config.json: 8 SwiGLU experts of 14336, 2 per token, in every layer
    "mixtral-8x7b": ModelConfig(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                                vocab_size=32000, max_seq_len=32768, rope_theta=1e6,
                                moe_experts=8, moe_top_k=2),
    # DeepSeek-V3's config.json: 3 dense layers (FFN 18432), then 58 MoE layers of 256 routed
    # experts (FFN 2048) and 1 shared, 8 per token scored by a sigmoid, on at most 4 servers;
    # pretrained at 4K tokens. Its multi-head latent attention is priced as 128 full heads
    # (an assumption: within about a tenth of MLA's attention parameters).
    "deepseek-v3": ModelConfig(n_layers=61, dim=7168, n_heads=128, n_kv_heads=128, ffn_dim=18432,
                               vocab_size=129280, max_seq_len=4096, moe_experts=256, moe_top_k=8,
                               moe_shared_experts=1, moe_ffn_dim=2048, moe_first_layer=3,
                               moe_score="sigmoid", moe_max_nodes=4, moe_bias_rate=0.001,
                               moe_aux_loss=0.0001),
}.items()}                                  # each preset named by its key


MLPS = ("swiglu", "gelu", "relu2")
MOE_SCORES = ("softmax", "sigmoid")

# The layout's vocabularies, each written once: the rules below, the flags' help, the cost
# model and the axis files all read these.
SCHEDULES = ("afab", "1f1b", "interleaved", "zb")
CP_IMPLS = ("ring", "allgather", "ulysses")
RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


def schedule_problems(schedule: str, pp: int, microbatches: int, virtual_stages: int,
                      consecutive: int | None = None) -> list[Problem]:
    """The rules of a pipeline schedule, which `schedules.make_schedule` refuses to break.
    Interleaved runs the micro-batches through each chunk in groups of `consecutive` (N,
    default pp): m a multiple of N, and N >= pp unless one group holds all m (the simulator
    found that several groups smaller than the pipeline deadlock)."""
    if schedule not in SCHEDULES:
        return [unknown("--schedule", schedule, SCHEDULES)]
    chunks = Problem(f"--virtual-stages {virtual_stages} needs --schedule interleaved (schedule "
                     f"{schedule!r} has one chunk per rank)", "--virtual-stages", "chunks",
                     virtual_stages=virtual_stages)
    groups = Problem(f"--schedule interleaved needs --microbatches ({microbatches}) to be a "
                     f"multiple of --pp {pp}: micro-batches go through each chunk in groups of "
                     "pp", "--schedule", "groups", microbatches=microbatches, pp=pp)
    interleaved = schedule == "interleaved"
    out = [chunks] if virtual_stages > 1 and not interleaved else []
    if consecutive is None:
        return out + ([groups] if interleaved and pp > 1 and microbatches % pp else [])
    n, m, flag = consecutive, microbatches, "--consecutive-microbatches"
    return out + (positive(consecutive_microbatches=n) or broken([
        (not interleaved, flag, "interleaved", f"{flag} {n}: consecutive micro-batches only apply "
         f"to --schedule interleaved, not {schedule!r}"),
        (interleaved and m % n, flag, "groups", f"{flag} {n} needs --microbatches ({m}) to be a "
         f"multiple of {n} (the groups of micro-batches that go through each chunk)"),
        (interleaved and n < pp and n != m, flag, "group size", f"{flag} {n} needs at least --pp "
         f"{pp} micro-batches per group, or all --microbatches ({m}) in one group")]))


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
    ep: int = opt(1, "expert-parallel degree: the experts split over ep ranks carved from the "
                     "dp x cp ranks (MoE models)")
    zero: int = opt(0, "ZeRO: 0 plain DP, 1 shards the optimizer state, 2 + gradients, 3 + weights")
    bucket_mb: float = opt(25.0, "MB per gradient bucket (0 = naive: each gradient after backward)")
    sp: bool = opt(False, "sequence parallelism (with --tp > 1)")
    tp_overlap: bool = opt(False, "collective matmul: SP's all-gather and reduce-scatter cut "
                                  "into ring steps hidden behind the matmuls (with --sp)")
    schedule: str = opt("1f1b", f"pipeline schedule: {', '.join(SCHEDULES)}")
    virtual_stages: int = opt(1, "model chunks per pipeline rank (--schedule interleaved)")
    microbatches: int | None = opt(None, "micro-batches per DP rank per step (default: "
                                         "--pp with --schedule interleaved, else 1)", type=int)
    consecutive_microbatches: int | None = opt(
        None, "micro-batches through a chunk before the next (--schedule interleaved; default "
        "--pp: Megatron's depth-first; --microbatches: breadth-first)", type=int)
    cp_impl: str = opt("ring", f"context-parallel attention: {' or '.join(CP_IMPLS)}")
    recompute: str = opt("none", "activation recomputation: none, selective (the attention "
                         "core) or full (each block from its input)", choices=RECOMPUTE_MODES)

    def __post_init__(self):
        # The default every schedule accepts: interleaved wants a multiple of --pp.
        if self.microbatches is None:
            m = self.pp if self.schedule == "interleaved" else 1
            object.__setattr__(self, "microbatches", m)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def problems(self, model: ModelConfig, seq_len: int, global_batch: int,
                 end_stages: int = 0) -> list[Problem]:
        """Every rule this layout breaks for this model and batch, one line each.
        `end_stages`: pipeline stages that may hold no layer. The trainer's split gives every
        stage one (0); the cost model's, Llama 3's, may give the embedding and the head a
        stage each (2)."""
        out = positive(tp=self.tp, cp=self.cp, pp=self.pp, dp=self.dp, ep=self.ep,
                       microbatches=self.microbatches, virtual_stages=self.virtual_stages,
                       seq_len=seq_len, global_batch=global_batch)
        if out:
            return out
        words = (("zero", ZERO_STAGES), ("cp_impl", CP_IMPLS), ("recompute", RECOMPUTE_MODES))
        out = [unknown(flag_of(k), getattr(self, k), known) for k, known in words
               if getattr(self, k) not in known]
        # `not 0 <= x`, never `x < 0`: NaN compares False with everything
        out += broken([(not 0 <= self.bucket_mb < math.inf, "--bucket-mb", "range",
                        f"--bucket-mb {self.bucket_mb} must be >= 0 (0 = naive all-reduce)")])
        out += schedule_problems(self.schedule, self.pp, self.microbatches, self.virtual_stages,
                                 self.consecutive_microbatches)
        return out + broken(self._shard_rules(model, seq_len) + self._expert_rules(model)
                            + self._fit_rules(model, seq_len, global_batch, end_stages))

    def _expert_rules(self, m: ModelConfig) -> list[tuple]:
        """EP splits the experts over ranks carved from dp x cp; TP splits each expert.
        Capacity and the balance loss count over whole sequences, which CP cuts."""
        ep, dpcp, e, moe = self.ep, self.dp * self.cp, m.moe_experts, m.is_moe
        return [
            (ep > 1 and not moe, "--ep", "needs experts", f"--ep {ep} needs --moe-experts E > 0"),
            (moe and e % ep, "--ep", "divides", f"--ep {ep} does not divide --moe-experts {e}"),
            (dpcp % ep, "--ep", "carved", f"--ep {ep} must divide dp*cp={dpcp} (expert-parallel "
             "ranks are carved from the data- and context-parallel ranks)"),
            (ep > 1 and self.zero == 3, "--ep", "zero 3",
             f"--ep {ep} does not combine with --zero 3"),
            (moe and m.expert_ffn_dim % self.tp, "--tp", "divides", f"--tp {self.tp} does not "
             f"divide the experts' ffn dim {m.expert_ffn_dim}"),
            *[(moe and self.cp > 1 and getattr(m, f) > 0, flag_of(f), "cp", f"{flag_of(f)} "
               "counts over whole sequences: needs --cp 1")
              for f in ("moe_capacity_factor", "moe_aux_loss")]]

    def _shard_rules(self, m: ModelConfig, seq_len: int) -> list[tuple]:
        """TP shards the heads, the FFN and the vocabulary; SP and CP the sequence. Ulysses
        trades sequence shards for head shards: each CP rank gets 1/cp of the TP rank's
        heads. KV heads fewer than cp are replicated (GQA), if cp is a multiple."""
        tp, cp, sp, local = self.tp, self.cp, self.sp, seq_len // self.cp
        kv = m.n_kv_heads // tp                    # KV heads per TP rank
        what = f"--seq-len {seq_len}" if cp == 1 else f"the per-CP-rank sequence {local}"
        chunks = cp > 1 and seq_len % (2 * cp)     # when broken, SP's rule is not checked
        ulysses = (self.cp_impl == "ulysses" and cp > 1         # its rules, once TP's hold
                   and not (m.n_heads % tp or m.n_kv_heads % tp))
        divides = [(getattr(m, k) % tp, "--tp", "divides", f"--tp {tp} does not divide {k}="
                    f"{getattr(m, k)}") for k in ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size")]
        return divides + [
            (sp and tp == 1, "--sp", "needs tp",
             "--sp needs --tp > 1 (sequence parallelism shards along the TP group)"),
            (chunks, "--cp", "chunks", f"--cp {cp} needs --seq-len divisible by 2*cp={2 * cp} "
             f"(load-balanced causal chunks); got {seq_len}"),
            (sp and tp > 1 and local % tp and not chunks, "--sp", "slices", f"--sp needs {what} "
             f"divisible by --tp {tp} (each TP rank keeps a slice of the sequence)"),
            (self.tp_overlap and not sp, "--tp-overlap", "needs sp",
             "--tp-overlap needs --sp (it overlaps SP's all-gather and reduce-scatter)"),
            (self.tp_overlap and self.pp > 1 and self.schedule == "zb", "--tp-overlap", "zb",
             "--tp-overlap does not combine with --schedule zb (W would rerun the ring of each "
             "collective matmul)"),
            (ulysses and m.n_heads % (cp * tp), "--cp-impl", "heads", f"--cp-impl ulysses needs "
             f"n_heads={m.n_heads} divisible by cp*tp={cp * tp} (each rank attends with a share "
             "of the heads)"),
            (ulysses and kv % cp and cp % kv, "--cp-impl", "kv heads", f"--cp-impl ulysses needs "
             f"the KV heads per TP rank ({kv}) divisible by --cp {cp}, or --cp a multiple of them "
             "(to replicate them)")]

    def _fit_rules(self, m: ModelConfig, seq_len: int, global_batch: int,
                   end_stages: int) -> list[tuple]:
        """The batch splits into the layout's micro-batches; the stages fit the model."""
        pp, v, split = self.pp, self.virtual_stages, self.dp * self.microbatches
        most = m.n_layers + end_stages
        why = (f" (--microbatches defaults to --pp {pp} with --schedule interleaved)"
               if self.schedule == "interleaved" and self.microbatches == pp > 1 else "")
        limit = (f"n_layers + {end_stages} = {most} (embedding and head may take a stage each)"
                 if end_stages else f"n_layers={m.n_layers}")
        return [
            (seq_len > m.max_seq_len, "--seq-len", "positions",
             f"--seq-len {seq_len} exceeds the model's max_seq_len={m.max_seq_len}"),
            (global_batch % split, "--global-batch", "split", f"--global-batch {global_batch} "
             f"is not divisible by dp*microbatches={self.dp}*{self.microbatches}={split}{why}"),
            (pp * v > most, "--pp", "stages",
             f"--pp {pp} x --virtual-stages {v} = {pp * v} stages exceeds {limit}"),
            (v > 1 and pp == 1, "--virtual-stages", "needs pp",
             f"--virtual-stages {v} needs --pp > 1 (the chunks go round the pipeline ranks)")]

    def validate(self, model: ModelConfig, seq_len: int, global_batch: int) -> "ParallelConfig":
        """Raise `ConfigError` listing every broken rule; return self when all hold."""
        refuse(model.problems() + self.problems(model, seq_len, global_batch))
        return self

    # `layout.replace(zero=2)`, `layout.as_dict()`: dataclasses' own, as methods
    replace = replace
    as_dict = asdict


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
    data: str | None = opt(None, "train on this text file: as bytes, or with --init-hf's "
                                 "tokenizer.json (default: synthetic)")
    # the model's MoE fields (`ModelConfig`), replacing the preset's when given
    moe_experts: int | None = opt(None, "routed experts per MoE layer (0: dense)", type=int)
    moe_top_k: int | None = opt(None, "experts each token is sent to", type=int)
    moe_shared_experts: int | None = opt(None, "experts every token passes through", type=int)
    moe_capacity_factor: float | None = opt(None, "0: dropless; C > 0: a capacity", type=float)
    moe_aux_loss: float | None = opt(None, "weight of the sequence-wise balance loss", type=float)
    moe_bias_rate: float | None = opt(None, "step of the routing bias (0: off)", type=float)
    init_hf: str | None = opt(None, "start from a Hugging Face Llama or Mixtral directory "
                                    "(replaces --model)")
    export_hf: str | None = opt(None, "write the final model as a Hugging Face Llama or "
                                      "Mixtral directory")
    log_json: str | None = opt(None, "write one JSON object per step (JSON Lines)")
    profile: str | None = opt(None, "write a Chrome/Perfetto trace of the job to DIR/trace.json "
                                    "(ui.perfetto.dev) and print how much communication was hidden")
    dtype: str = opt("auto", "auto (bf16 autocast on CUDA, fp32 on CPU), fp32 or bf16")
    timeout_s: float = opt(60.0, "collective timeout: a dead peer fails within it")
    save: str | None = opt(None, "checkpoint directory (DIR/step_000010, DIR/latest)")
    save_every: int = opt(0, "checkpoint every K steps (0: only at the end)")
    resume: str | None = opt(None, "resume from a checkpoint or a --save DIR's latest (any layout)")
    fail_at_step: int | None = opt(None, "teaching: kill --fail-rank at this step", type=int)
    fail_rank: int | None = opt(None, "the rank --fail-at-step kills (default 0)", type=int)
    max_restarts: int = opt(0, "on a failure, restart from --save's last checkpoint, up to N times")
    skip_nonfinite: bool = opt(False, "skip (no update) a step whose loss or grad norm is NaN "
                                      "or inf instead of stopping the run, at most 3 in a row (a "
                                      "4th ends it: exit 1); non-finite weights are never saved")
    stop_grace_s: float = opt(30.0, "on SIGTERM (Ctrl-C: at most 5): seconds to finish the step "
                                    "and (with --save) checkpoint before the ranks are killed")
    resume_allow_change: bool = opt(False, "let --resume change the checkpoint's --seq-len, "
                                           "--global-batch, --data or --seed (the log says so)")
    progress: bool = opt(True, "no tqdm bar", flag="--no-progress")
    # --init-hf's model, read from DIR/config.json by the Hugging Face chapter's code
    # (`hf.with_model`, which `preflight.check_run` calls first); it replaces --model's.
    init_model: ModelConfig | None = None
    peak_flops: float | None = None   # the device's peak, for MFU (measured when None)

    def model_config(self) -> ModelConfig:
        """The model this run trains: --init-hf's (once read), else --model's preset."""
        if self.init_hf and self.init_model is None:
            raise ConfigError(f"--init-hf {self.init_hf}: config.json not read yet (hf.with_model)")
        # the model's MoE fields that the run's flags (TrainConfig's moe_*) replace
        given = {k: v for k, v in vars(self).items() if k.startswith("moe_") and v is not None}
        return replace(self.init_model or ModelConfig.preset(self.model), **given)

    def problems(self) -> list[Problem]:
        """The rules of the run itself (the layout's are ParallelConfig's). Each real-valued flag
        finite and in its range, written `not lo <= x <= hi`, never `x < lo`: NaN compares False
        with everything, so `nan < 0` would let it through."""
        out = [unknown("--dtype", self.dtype, DTYPES)] if self.dtype not in DTYPES else []
        counts = ("steps", "warmup_steps", "decay_steps", "save_every", "max_restarts")
        numbers = [(k, getattr(self, k) >= 0, "must be >= 0") for k in counts] + [
            # field, in its range?, the rule
            ("lr", 0 < self.lr <= 1,        # beyond 1 no run learns, it only diverges
             "must be in (0, 1]: AdamW moves every weight by about lr per step"),
            ("weight_decay", 0 <= self.weight_decay < math.inf, "must be finite and >= 0"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "must be in [0, 1] (a fraction of --lr)"),
            ("clip", 0 <= self.clip < math.inf, "must be finite and >= 0 (0 = off)"),
            # a rank connects to the others within it, and the heartbeat beats every 0.5 s
            ("timeout_s", 1 <= self.timeout_s < math.inf, "must be finite and positive, >= 1 s"),
            ("seed", 0 <= self.seed < 2**44, "must be in [0, 2**44): the data's generator is "
             "seeded seed * 1000003 + step, and torch's seeds are under 2**64"),
            ("stop_grace_s", 0 <= self.stop_grace_s < math.inf, "must be finite and >= 0")]
        out += broken((not ok, flag_of(k), "range", f"{flag_of(k)} {getattr(self, k)} {rule}")
                      for k, ok, rule in numbers)
        # flags that need another flag, or a value that fits the run
        fail, rank, n = self.fail_at_step, self.fail_rank or 0, self.parallel.world_size
        return out + broken([
            (self.fail_rank is not None and fail is None, "--fail-rank", "needs",
             f"--fail-rank {self.fail_rank} needs --fail-at-step K"),
            (fail is not None and not 0 <= fail < self.steps, "--fail-at-step", "range",
             f"--fail-at-step {fail} must be a step of the run: 0..{self.steps - 1} "
             f"(--steps {self.steps})"),
            (fail is not None and not 0 <= rank < n, "--fail-rank", "range",
             f"--fail-rank {rank} is not a rank of this layout (0..{n - 1})"),
            (self.max_restarts > 0 and not self.save, "--max-restarts", "needs", f"--max-restarts "
             f"{self.max_restarts} needs --save DIR: a restart resumes from its latest checkpoint"),
            (self.save_every > 0 and not self.save, "--save-every", "needs",
             f"--save-every {self.save_every} needs --save DIR"),
            ((self.init_hf or self.export_hf) and self.model_config().is_moe
             and not self.model_config().mixtral, "--init-hf" if self.init_hf else "--export-hf",
             "experts", "--init-hf and --export-hf read and write Llama and Mixtral "
             "directories: a model with experts must be Mixtral's (in every layer, "
             "softmax-scored, none shared)"),
            (self.export_hf and self.model_config().moe_bias_rate > 0, "--export-hf", "bias",
             f"--export-hf writes a Mixtral, which has no routing bias: --moe-bias-rate "
             f"{self.model_config().moe_bias_rate} must be 0")])

    def validate(self) -> "TrainConfig":
        """Raise `ConfigError` listing every broken rule (model, layout, run)."""
        self.parallel.validate(self.model_config(), self.seq_len, self.global_batch)
        refuse(self.problems())
        return self
