"""The batch a step processes, and every rule a model + layout + batch must obey.

Chapter "MFU and communication volume". A `Workload` is the global batch (sequences of
`seq_len` tokens) cut into micro-batches per data-parallel rank; `layout_problems` lists,
one line per broken rule and naming the flag, why a layout cannot run it, so that `estimate`
never predicts a step the trainer would refuse.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import ConfigError, ModelConfig, ParallelConfig, Problem, broken, positive, unknown
from .constants import TABLE4_BATCH_TOKENS
from ..schedules import rank_layers


@dataclass(frozen=True)
class Workload:
    """A global batch of `global_batch` sequences of `seq_len` tokens, fed to each DP rank in
    micro-batches of `microbatch_size` sequences."""

    seq_len: int
    global_batch: int
    microbatch_size: int = 1
    recompute: str = "none"
    stage_split: str = "even"       # how layers go to pipeline stages (`stage_loads`)
    # with recompute "full": the first N layers of each model chunk (a pipeline stage, or a
    # virtual one) recomputed, the rest not (Megatron's --recompute-method block
    # --recompute-num-layers N); None: every layer
    recompute_layers: int | None = None
    # a mixture of experts' routing: the busiest expert's tokens over the mean (--moe-imbalance)
    moe_imbalance: float = 1.0

    @property
    def tokens(self) -> int:
        return self.seq_len * self.global_batch

    def microbatches(self, parallel: ParallelConfig) -> int:
        return self.global_batch // (parallel.dp * self.microbatch_size)

    def tokens_per_microbatch(self, parallel: ParallelConfig) -> int:
        """Tokens one GPU processes per micro-batch: its 1/cp of each sequence."""
        return self.microbatch_size * self.seq_len // parallel.cp

    def recomputed_layers(self, chunk_layers) -> float:
        """How many of a pipeline rank's layers (`chunk_layers`: those of each of its model
        chunks) run their forward twice: all of them under full recomputation, the first
        `recompute_layers` of each chunk with a layer count, none otherwise."""
        if self.recompute != "full":
            return 0.0
        if self.recompute_layers is None:
            return float(sum(chunk_layers))
        return float(sum(min(self.recompute_layers, n) for n in chunk_layers))


def make_workload(seq_len: int, global_batch_tokens: int | None = None,
                  global_batch: int | None = None, microbatch_size: int = 1,
                  recompute: str = "none", recompute_layers: int | None = None) -> Workload:
    """The batch from either --global-batch-tokens or --global-batch (sequences).
    `recompute_layers` N (--recompute-layers): full recomputation of the first N layers of
    each model chunk, Megatron's `--recompute-granularity full --recompute-method block
    --recompute-num-layers N`: with --recompute none or full, never selective (Megatron:
    "recompute_num_layers must be None" for selective granularity); 0 recomputes nothing."""
    if global_batch_tokens is not None and global_batch is not None:
        raise ConfigError("--global-batch-tokens and --global-batch are exclusive: give one")
    if recompute_layers is not None:
        if recompute == "selective":
            raise ConfigError(f"--recompute-layers {recompute_layers} recomputes whole layers: it "
                              "does not combine with --recompute selective (give one)")
        if not recompute_layers >= 0:
            raise ConfigError(f"--recompute-layers {recompute_layers} must be >= 0 (0: no layer)")
        recompute = "full" if recompute_layers > 0 else "none"
        recompute_layers = recompute_layers if recompute_layers > 0 else None
    if global_batch is None:
        tokens = TABLE4_BATCH_TOKENS if global_batch_tokens is None else global_batch_tokens
        bad = positive(seq_len=seq_len, global_batch_tokens=tokens)
        if bad:
            raise ConfigError(bad[0])
        if tokens % seq_len:
            raise ConfigError(f"--global-batch-tokens {tokens} is not a multiple of --seq-len {seq_len}")
        global_batch = tokens // seq_len
    return Workload(seq_len, global_batch, microbatch_size, recompute,
                    recompute_layers=recompute_layers)


def workload_problems(parallel: ParallelConfig, work: Workload) -> list[str]:
    """Rules of the batch itself, beyond `ParallelConfig.problems`."""
    out = positive(microbatch_size=work.microbatch_size, global_batch=work.global_batch)
    if out:
        return out[:1]
    if parallel.dp >= 1 and work.global_batch % parallel.dp == 0:
        per_rank = work.global_batch // parallel.dp
        if per_rank % work.microbatch_size:
            out.append(f"--microbatch-size {work.microbatch_size} does not divide the "
                       f"{per_rank} sequences per DP rank (--global-batch {work.global_batch} / --dp {parallel.dp})")
    elif parallel.dp >= 1:
        out.append(f"--dp {parallel.dp} does not divide the global batch of {work.global_batch} sequences")
    return out


# Llama 3 puts the embedding and the head in stages of their own (`parallel.schedules.stage_split`):
# up to n_layers + 2 pipeline stages, where the trainer's split needs a layer in each.
END_STAGES = 2


def layout_problems(model: ModelConfig, parallel: ParallelConfig, work: Workload) -> list[str]:
    """Every rule this model + layout + batch breaks, one line each (empty: all is well)."""
    out = model.problems() + workload_problems(parallel, work)
    if out:
        return out
    # A cost model does not care about trained position limits: long-context rows (131K)
    # run a model whose config says 8K.
    long_model = replace(model, max_seq_len=max(model.max_seq_len, work.seq_len))
    layout = parallel.replace(recompute=work.recompute)   # the batch's recompute is the knob
    out += recompute_layers_problems(model, parallel, work)
    out += ep_problems(model, parallel, work.moe_imbalance)
    for p in layout.problems(long_model, work.seq_len, work.global_batch, END_STAGES):
        if "microbatches" in p.values:       # this CLI has no --microbatches: say where it comes from
            p = Problem(f"{p} (micro-batches per DP rank = --global-batch {work.global_batch} / "
                        f"(--dp {parallel.dp} x --microbatch-size {work.microbatch_size}))",
                        p.flag, p.rule, **p.values)
        out.append(p)
    return out


def recompute_layers_problems(model: ModelConfig, parallel: ParallelConfig,
                              work: Workload) -> list[Problem]:
    """--recompute-layers N counts layers of one pipeline stage: 0 <= N <= the layers a
    stage holds (Megatron: "recompute_num_layers must be between 1 and
    num_layers_per_pipeline_rank"), never with selective recomputation."""
    n, flag = work.recompute_layers, "--recompute-layers"
    if n is None:
        return []
    most = -(-model.n_layers // max(parallel.pp, 1))
    return [Problem(line, flag, rule, recompute_layers=n) for bad, rule, line in (
        (work.recompute == "selective", "selective", f"{flag} {n} recomputes whole layers: it "
         "does not combine with --recompute selective (give one)"),
        (not 0 <= n <= most, "range", f"{flag} {n} must be in [0, {most}]: the layers of one "
         f"pipeline stage (n_layers={model.n_layers} / --pp {parallel.pp})")) if bad]


def ep_problems(model: ModelConfig, pc: ParallelConfig, imbalance: float = 1.0) -> list[Problem]:
    """The rule of --moe-imbalance (--ep's own are `ParallelConfig.problems`'): the busiest
    expert takes between the mean and every token, and each token meets an expert at most
    once: at most E / top_k times the mean."""
    most = model.moe_experts / model.moe_top_k if model.is_moe and model.moe_top_k > 0 else 1.0
    return broken([(not 1.0 <= imbalance <= most, "--moe-imbalance", "range",
                    f"--moe-imbalance {imbalance} must be in [1, {most:g}]: the busiest expert's "
                    "load over the mean (1 = balanced; at most every token, E / top_k times the "
                    "mean)")])


STAGE_SPLITS = ("even", "nanotron", "trainer")


def block_costs(model: ModelConfig) -> tuple[float, float]:
    """(a transformer block, the LM head) in nanotron's units: the weights each multiplies,
    4 h^2 + 3 h f for a block (attention as if every head had its own K/V) and V h for the head."""
    h = model.dim
    return 4.0 * h * h + 3.0 * h * model.ffn_dim, float(model.vocab_size * h)


def nanotron_split(model: ModelConfig, pp: int) -> list[tuple[int, int]]:
    """(blocks, heads) of each pipeline rank as nanotron assigns them: blocks in order
    (embedding, the layers, the head), each to the current rank, which is closed once the
    running cost passes rank r's share (r + 1) / pp of the total."""
    block, head = block_costs(model)
    costs = [block] * model.n_layers + [head]
    total, running, rank = sum(costs), 0.0, 0
    out = [[0, 0] for _ in range(pp)]
    for i, c in enumerate(costs):
        running += c
        out[rank][1 if i == model.n_layers else 0] += 1
        if running > total * (rank + 1) / pp and rank < pp - 1:
            rank += 1
    return [tuple(x) for x in out]


def stage_loads(model: ModelConfig, pp: int, split: str = "even",
                virtual_stages: int = 1) -> list[tuple[float, float]]:
    """(layers, share of the LM head) of each pipeline rank. "even": n_layers / pp and 1/pp
    of the head on every rank, a perfect balance. "nanotron": `nanotron_split` (80 layers +
    head on 16 ranks: two ranks hold 6 layers, not 5). "trainer": minipar's own
    (`parallel.schedules.stage_split` over pp x `virtual_stages` stages, the whole head on the
    last rank), which is Llama 3's where there are more stages than layers: the embedding
    and the head take a stage of their own, so the first and last ranks hold one layer fewer
    (405B: 126 layers on 16 x 8 stages, 7 on the end ranks, 8 between). The busiest rank
    sets the pipeline's pace (`time.compute_seconds` weighs each by its seconds)."""
    if split not in STAGE_SPLITS:
        raise ConfigError(unknown("stage split", split, STAGE_SPLITS))
    if split == "even" or pp == 1:
        return [(model.n_layers / pp, 1.0 / pp)]
    if split == "trainer":
        return [(float(n), float(r == pp - 1)) for r, n in
                enumerate(rank_layers(model, pp, virtual_stages, r) for r in range(pp))]
    return [(float(n), float(h)) for n, h in nanotron_split(model, pp)]
