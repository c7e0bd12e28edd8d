"""The training loop and its command line: `python -m minipar.train --tp T --cp C --pp P --dp D`.

The same seed, model and global batch give the same loss curve for every layout: each rank
builds the same full model from the seed and keeps its slice, reads the same global batch and
keeps its slice, and the loss is a sum over tokens divided by the *global* token count, so
summing gradients over ranks gives exactly the single-device gradient.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import checkpoint, comm, launch
from .config import ConfigError, ModelConfig, ParallelConfig
from .data import local_microbatches, make_source
from .grid import ProcessGrid
from .model import Transformer, cross_entropy_sum
from .parallel.data import DataParallel


@dataclass
class TrainConfig:
    """Everything one run needs; the CLI fills it, tests and notebooks build it directly."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: str = "tiny"
    global_batch: int = 8
    seq_len: int = 32
    steps: int = 10
    seed: int = 0
    lr: float = 3e-3
    warmup_steps: int = 10
    decay_steps: int = 1000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    data: str | None = None
    log_json: str | None = None
    trace: str | None = None
    timeout_s: float = 60.0
    peak_flops: float | None = None
    dtype: str = "auto"             # compute dtype: auto = bf16 autocast on CUDA, fp32 on CPU
    progress: bool = True
    capture_grads: bool = False     # tests: each rank returns its gradients after step 1
    save: str | None = None         # checkpoint directory: DIR/step_000010, ..., DIR/latest
    save_every: int = 0             # steps between checkpoints (0: only at the end)
    resume: str | None = None       # a checkpoint directory, or a --save DIR (its latest)
    fail_at_step: int | None = None     # teaching and tests: --fail-rank dies at this step
    fail_rank: int | None = None
    max_restarts: int = 0           # restart the world from --save's latest checkpoint

    def model_config(self) -> ModelConfig:
        return ModelConfig.preset(self.model)

    def validate(self) -> "TrainConfig":
        self.parallel.validate(self.model_config(), self.seq_len, self.global_batch)
        for name in ("steps", "warmup_steps", "decay_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 0")
        if self.lr <= 0:
            raise ConfigError(f"--lr {self.lr} must be positive")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"--dtype {self.dtype!r} is unknown; choose auto, fp32 or bf16")
        if launch.in_torchrun() and int(os.environ["WORLD_SIZE"]) != self.parallel.world_size:
            p = self.parallel
            raise ConfigError(f"--tp {p.tp} x --cp {p.cp} x --pp {p.pp} x --dp {p.dp} = "
                              f"{p.world_size} ranks, but torchrun started {os.environ['WORLD_SIZE']}")
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout-s {self.timeout_s} must be positive")
        if self.data is not None:
            if not os.path.isfile(self.data):
                raise ConfigError(f"--data {self.data}: no such file")
            if self.model_config().vocab_size < 256:
                raise ConfigError("--data trains on bytes and needs a vocabulary of at least 256")
        self._check_faults()
        checkpoint.check_flags(self)
        return self

    def _check_faults(self):
        if self.fail_rank is not None and self.fail_at_step is None:
            raise ConfigError(f"--fail-rank {self.fail_rank} needs --fail-at-step K")
        if self.fail_at_step is not None:
            if not 0 <= self.fail_at_step < self.steps:
                raise ConfigError(f"--fail-at-step {self.fail_at_step} must be a step of the run: "
                                  f"0..{self.steps - 1} (--steps {self.steps})")
            rank, n = self.fail_rank or 0, self.parallel.world_size
            if not 0 <= rank < n:
                raise ConfigError(f"--fail-rank {rank} is not a rank of this layout (0..{n - 1})")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts} must be >= 0")
        if self.max_restarts and not self.save:
            raise ConfigError(f"--max-restarts {self.max_restarts} needs --save DIR: "
                              "a restart resumes from its latest checkpoint")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr over `decay_steps`.

    Its length is set by its own flags, never by --steps, so a run stopped at step 50 and
    resumed follows the schedule it would have followed.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.decay_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * t))


# ---------------------------------------------------------------- building the model
def build_model_parts(mcfg: ModelConfig, pcfg: ParallelConfig, grid: ProcessGrid, seed: int):
    """This rank's pieces of the model: one module, or one per virtual pipeline stage.

    Every axis transforms the reference model; none builds its own. Init is by parameter
    name and seed, so the pieces hold exactly the single-device weights.
    """
    if pcfg.pp > 1:
        from .parallel.pipeline import build_stage_modules
        parts = build_stage_modules(mcfg, pcfg, grid, seed)
    else:
        parts = [Transformer(mcfg, seed=seed)]
    if pcfg.tp > 1:
        from .parallel.tensor import apply_tensor_parallel
        parts = [apply_tensor_parallel(m, grid.tp, sp=pcfg.sp) for m in parts]
    if pcfg.cp > 1:
        from .parallel.context import apply_context_parallel
        parts = [apply_context_parallel(m, grid.cp, impl=pcfg.cp_impl) for m in parts]
    return parts


def loss_function(pcfg: ParallelConfig, grid: ProcessGrid):
    """Sum of token losses of this rank's logits (vocab-parallel under TP)."""
    if pcfg.tp > 1:
        from .parallel.tensor import vocab_parallel_cross_entropy_sum
        return lambda logits, y: vocab_parallel_cross_entropy_sum(logits, y, grid.tp)
    return cross_entropy_sum


def zero3_units(parts):
    """The modules ZeRO-3 gathers one at a time: the embedding, each block, norm, head."""
    units = []
    for m in parts:
        units += [u for u in (m.embed_tokens, *m.layers.values(), m.norm, m.lm_head) if u is not None]
    return units


def shard_sequence(x, y, pcfg: ParallelConfig, grid: ProcessGrid):
    """Under CP each rank keeps its (load-balanced) chunks of the sequence and their
    positions; otherwise the whole sequence at positions 0..s-1."""
    if pcfg.cp > 1:
        from .parallel.context import shard_for_context_parallel
        return shard_for_context_parallel(x, y, grid.cp)
    return x, y, torch.arange(x.shape[1], device=x.device)


# ---------------------------------------------------------------- one step
def forward_backward(parts, micro, loss_fn, n_tokens, dp, pcfg, grid, trace=None):
    """Run every micro-batch forward and backward; return this rank's share of the loss."""
    if pcfg.pp > 1:
        from .parallel.pipeline import pipeline_forward_backward
        return pipeline_forward_backward(parts, micro, loss_fn, n_tokens, dp, pcfg, grid, trace)
    model = parts[0]
    total = torch.zeros((), device=micro[0].device)
    for i, mb in enumerate(micro):
        dp.set_last_microbatch(i == len(micro) - 1)
        x, y, pos = shard_sequence(mb[:, :-1], mb[:, 1:], pcfg, grid)
        loss = loss_fn(model(x, pos), y) / n_tokens
        loss.backward()
        total += loss.detach()
    return total


def counts_here(p, grid: ProcessGrid, replicated_over_dp: bool) -> bool:
    """Does this rank's copy of `p` count in the global gradient norm? Copies of one
    parameter (over DP without ZeRO, over TP for norms, ...) are counted once: on the rank
    with index 0 on each axis it is copied along."""
    axes = getattr(p, "_replica_axes", ())
    if replicated_over_dp:
        axes = (*axes, "dp_cp")
    return all(getattr(grid, a).rank == 0 for a in axes)


def clip_grad_norm(dp: DataParallel, grid: ProcessGrid, max_norm: float):
    """The global gradient norm over every rank's unique gradients; returns (norm, scale)."""
    sq = torch.zeros((), dtype=torch.float64, device=launch.device())
    for g, p in dp.grads():
        if counts_here(p, grid, dp.zero == 0):
            sq += g.detach().double().pow(2).sum()
    comm.all_reduce(sq, grid.world)
    norm = sq.sqrt().item()
    scale = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
    return norm, scale


def named_full_grads(parts, dp: DataParallel, grid: ProcessGrid) -> dict[str, torch.Tensor]:
    """Each parameter's gradient as this rank's model piece holds it (TP/PP-local, DP-full):
    ZeRO pieces are gathered back over dp x cp. For tests; not counted in CommLog."""
    out = {}
    with comm.paused():
        if dp.zero == 0:
            grads = {p: p.grad for p in dp.params}
        else:
            grads = {}
            for b in dp.buckets:
                pieces = b.piece_grads or [torch.zeros_like(x) for x in b.pieces]
                full = b.layout.unpack(comm.all_gather(b.layout.pad_pieces(pieces), dp.axis))
                grads.update(zip(b.params, full))
        for m in parts:
            for name, p in m.named_parameters():
                if p in grads:
                    out[name] = grads[p].detach().clone()
    return out


# ---------------------------------------------------------------- the loop, per rank
def train_on_rank(cfg: TrainConfig) -> dict:
    """What every rank runs. Returns rank 0's per-step records (and, for tests, grads)."""
    rank = dist.get_rank()
    pcfg, mcfg = cfg.parallel, cfg.model_config()
    grid = ProcessGrid(pcfg.tp, pcfg.cp, pcfg.pp, pcfg.dp, rank).init_groups()
    device = launch.device()
    parts = [m.to(device) for m in build_model_parts(mcfg, pcfg, grid, cfg.seed)]
    if compute_dtype(cfg, device) == torch.bfloat16:
        # mixed precision: weights, gradients and optimizer stay fp32 (the master copy);
        # matmuls run in bf16 inside each part's forward
        for m in parts:
            m.forward = torch.autocast(device.type, dtype=torch.bfloat16)(m.forward)
    dp = DataParallel(parts, grid.dp_cp, zero=pcfg.zero, bucket_mb=pcfg.bucket_mb,
                      units=zero3_units(parts), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = loss_function(pcfg, grid)
    source = make_source(cfg.data, mcfg.vocab_size, cfg.seed)
    n_tokens = cfg.global_batch * cfg.seq_len
    start, history = 0, []
    if cfg.resume:       # the weights and optimizer state of a checkpoint, in this layout
        start, history = checkpoint.load(cfg.resume, parts, dp, grid, mcfg)
    records, grads, trace = list(history), None, [] if cfg.trace else None
    log = open_log(cfg.log_json, history) if (cfg.log_json and rank == 0) else None
    steps = range(start, cfg.steps)
    if rank == 0 and cfg.progress:
        from tqdm.auto import tqdm
        steps = tqdm(steps, desc=f"train {pcfg.tp}x{pcfg.cp}x{pcfg.pp}x{pcfg.dp}", leave=False)
    for step in steps:
        maybe_fail(cfg, step, rank)
        comm.LOG.reset()
        t0 = time.perf_counter()
        batch = source.batch(step, cfg.global_batch, cfg.seq_len).to(device)
        micro = local_microbatches(batch, grid.dp.rank, pcfg.dp, pcfg.microbatches)
        dp.start_step()
        loss = forward_backward(parts, micro, loss_fn, n_tokens, dp, pcfg, grid, trace)
        dp.finish_backward()
        if pcfg.pp > 1 and mcfg.tie_embeddings:   # embedding (first stage) = head (last)
            from .parallel.pipeline import sync_tied_gradients
            sync_tied_gradients(parts, dp, grid)
        if cfg.capture_grads and step == 0:
            grads = named_full_grads(parts, dp, grid)
        norm, scale = clip_grad_norm(dp, grid, cfg.clip)
        lr = lr_at(step, cfg)
        dp.step(lr, scale)
        # every rank holds part of the loss (its tokens; the last pipeline stage only);
        # the TP ranks of a group all hold the same part: count it once
        if grid.tp.rank != 0:
            loss = torch.zeros_like(loss)
        with comm.paused():
            comm.all_reduce(loss, grid.world)
        dt = time.perf_counter() - t0
        rec = step_record(step, loss.item(), norm, lr, dt, n_tokens, mcfg, cfg, grid)
        records.append(rec)
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if checkpoint_due(cfg, step + 1):
            checkpoint.save(cfg.save, step + 1, parts, dp, grid, cfg, records)
        if rank == 0 and cfg.progress and hasattr(steps, "set_postfix"):
            steps.set_postfix(loss=f"{rec['loss']:.4f}")
    if log:
        log.close()
    if cfg.trace:
        write_trace(cfg.trace, trace, grid)
    return {"records": records if rank == 0 else None, "grads": grads,
            "memory": dp.memory_bytes(), "coords": grid.coords(rank)}


def open_log(path: str, history: list[dict]):
    """The JSON Lines log. A resumed run rewrites it from the checkpoint's records, so the
    whole curve is there once, however often the run was interrupted."""
    log = open(path, "w")
    for rec in history:
        log.write(json.dumps(rec) + "\n")
    return log


def checkpoint_due(cfg: TrainConfig, done: int) -> bool:
    """After `done` steps: every --save-every steps, and at the end."""
    return bool(cfg.save) and (done == cfg.steps or (cfg.save_every > 0 and done % cfg.save_every == 0))


def maybe_fail(cfg: TrainConfig, step: int, rank: int):
    """--fail-at-step K --fail-rank R: rank R dies at the start of step K, the way a GPU
    that falls off the bus does: no exception, no word to its peers, just gone."""
    if cfg.fail_at_step == step and rank == (cfg.fail_rank or 0):
        if cfg.progress:
            print(f"rank {rank}: injected failure at step {step} (--fail-at-step)", file=sys.stderr, flush=True)
        os._exit(1)


def compute_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "bf16" or (cfg.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def step_record(step, loss, norm, lr, dt, n_tokens, mcfg, cfg, grid) -> dict:
    tps = n_tokens / dt
    rec = {"step": step, "loss": loss, "grad_norm": norm, "lr": lr, "step_time_s": dt,
           "tokens_per_s": tps, "mfu": None, "comm": comm.LOG.summary()}
    if cfg.peak_flops:
        try:
            from .flops import mfu
            # on a CPU the measured peak is the whole machine's, which the forked ranks
            # share; on GPUs each rank has a peak of its own
            n_dev = grid.world_size if launch.device().type == "cuda" else 1
            rec["mfu"] = mfu(tps, mcfg, cfg.seq_len, cfg.peak_flops, n_devices=n_dev)
        except ImportError:
            pass
    return rec


def write_trace(path, events, grid):
    """Gather every rank's pipeline events to rank 0 and write them as one JSON list."""
    gathered = [None] * grid.world_size
    with comm.paused():
        dist.all_gather_object(gathered, events or [])
    if grid.rank == 0:
        with open(path, "w") as f:
            json.dump([e for evs in gathered for e in evs], f)


# ---------------------------------------------------------------- entry points
def train(cfg: TrainConfig) -> dict:
    """Validate, then run on tp*cp*pp*dp ranks (forked locally, or this torchrun world).
    Returns rank 0's result: {"records": [...], "grads": ..., "memory": ...}, and
    "all": every rank's result when run locally, "failures": the restarts it survived.

    --max-restarts N: when a rank fails, start a fresh world from the latest checkpoint,
    up to N times. Under torchrun, restarting is torchrun's job (its own --max-restarts);
    a restarted worker sees TORCHELASTIC_RESTART_COUNT > 0 and resumes the same way."""
    cfg.validate()
    if cfg.peak_flops is None:
        cfg.peak_flops = _peak_flops()
    if launch.in_torchrun() and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and cfg.save:
        cfg = restarted(cfg)
    failures = []
    while True:
        try:
            results = launch.run(train_on_rank, cfg.parallel.world_size, cfg, timeout_s=cfg.timeout_s)
            break
        except launch.RankFailed as e:
            if len(failures) >= cfg.max_restarts or launch.in_torchrun():
                raise
            cfg = restarted(cfg)
            failures.append({"rank": e.rank, "error": str(e).splitlines()[0], "resumed_from": cfg.resume,
                             "resumed_at_step": checkpoint.step_of(cfg.resume)})
            if cfg.progress:
                print(f"{failures[-1]['error']}\nrestart {len(failures)}/{cfg.max_restarts} "
                      f"from {cfg.resume or 'the start'}", file=sys.stderr)
    out = dict(results[0])
    out["all"] = results
    out["failures"] = failures
    return out


def restarted(cfg: TrainConfig) -> TrainConfig:
    """The run a restart makes: it resumes from the newest checkpoint of --save (or, if
    there is none yet, from where the first attempt started), and the injected fault, a
    one-time event like a real one, is not injected again."""
    resume = cfg.save if checkpoint.latest(cfg.save) else cfg.resume
    return dataclasses.replace(cfg, resume=resume, fail_at_step=None, fail_rank=None).validate()


def _peak_flops():
    try:
        from .flops import peak_flops
        return peak_flops()
    except ImportError:
        return None


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # one line naming the flag, exit 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m minipar.train", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--tp", type=int, default=1, help="tensor-parallel degree (innermost)")
    a("--cp", type=int, default=1, help="context-parallel degree")
    a("--pp", type=int, default=1, help="pipeline-parallel degree")
    a("--dp", type=int, default=1, help="data-parallel degree (outermost)")
    a("--zero", type=int, default=0, help="ZeRO stage 0-3")
    a("--bucket-mb", type=float, default=25.0, help="gradient bucket size; 0 = naive all-reduce")
    a("--sp", action="store_true", help="sequence parallelism (with --tp > 1)")
    a("--schedule", default="1f1b", help="pipeline schedule: afab, 1f1b, interleaved, zb")
    a("--virtual-stages", type=int, default=1, help="model chunks per pipeline rank")
    a("--microbatches", type=int, default=1, help="micro-batches per DP rank per step")
    a("--cp-impl", default="ring", help="context-parallel attention: ring or allgather")
    a("--model", default="tiny", help="model preset: tiny, llama3-8b, llama3-70b, llama3-405b")
    a("--global-batch", type=int, default=8, help="sequences per optimizer step, all ranks")
    a("--seq-len", type=int, default=32)
    a("--steps", type=int, default=10, help="optimizer steps in total")
    a("--seed", type=int, default=0)
    a("--lr", type=float, default=3e-3, help="peak learning rate")
    a("--warmup-steps", type=int, default=10)
    a("--decay-steps", type=int, default=1000, help="length of the cosine decay after warmup")
    a("--min-lr-ratio", type=float, default=0.1)
    a("--weight-decay", type=float, default=0.1)
    a("--clip", type=float, default=1.0, help="global gradient-norm clip (0 = off)")
    a("--data", default=None, help="train on this text file as bytes (default: synthetic)")
    a("--log-json", default=None, help="write one JSON object per step (JSON Lines)")
    a("--trace", default=None, help="write each rank's pipeline events as JSON")
    a("--dtype", default="auto", help="auto (bf16 autocast on CUDA, fp32 on CPU), fp32 or bf16")
    a("--timeout-s", type=float, default=60.0, help="collective timeout: a dead peer fails within it")
    a("--save", default=None, help="checkpoint directory (DIR/step_000010, DIR/latest)")
    a("--save-every", type=int, default=0, help="checkpoint every K steps (0: only at the end)")
    a("--resume", default=None, help="resume from a checkpoint, or from a --save DIR's latest; "
                                      "any layout")
    a("--fail-at-step", type=int, default=None, help="teaching: kill --fail-rank at this step")
    a("--fail-rank", type=int, default=None, help="the rank --fail-at-step kills (default 0)")
    a("--max-restarts", type=int, default=0,
      help="on a failure, restart from --save's latest checkpoint, up to N times")
    a("--no-progress", action="store_true", help="no tqdm bar")
    return p


def config_from_args(ns: argparse.Namespace) -> TrainConfig:
    pcfg = ParallelConfig(tp=ns.tp, cp=ns.cp, pp=ns.pp, dp=ns.dp, zero=ns.zero,
                          bucket_mb=ns.bucket_mb, sp=ns.sp, schedule=ns.schedule,
                          virtual_stages=ns.virtual_stages, microbatches=ns.microbatches,
                          cp_impl=ns.cp_impl)
    return TrainConfig(parallel=pcfg, model=ns.model, global_batch=ns.global_batch,
                       seq_len=ns.seq_len, steps=ns.steps, seed=ns.seed, lr=ns.lr,
                       warmup_steps=ns.warmup_steps, decay_steps=ns.decay_steps,
                       min_lr_ratio=ns.min_lr_ratio, weight_decay=ns.weight_decay, clip=ns.clip,
                       data=ns.data, log_json=ns.log_json, trace=ns.trace,
                       timeout_s=ns.timeout_s, dtype=ns.dtype, progress=not ns.no_progress,
                       save=ns.save, save_every=ns.save_every, resume=ns.resume,
                       fail_at_step=ns.fail_at_step, fail_rank=ns.fail_rank,
                       max_restarts=ns.max_restarts)


def main(argv=None) -> int:
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(argv))
    try:
        cfg.validate()
    except ConfigError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    try:
        out = train(cfg)
    except launch.RankFailed as e:
        print(f"{parser.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        print(str(e), file=sys.stderr)
        return 1
    recs = out["records"]            # None on every rank but 0 (under torchrun)
    if recs:
        last = recs[-1]
        print(f"step {last['step']}: loss {last['loss']:.6f}  grad_norm {last['grad_norm']:.4f}  "
              f"{last['tokens_per_s']:.0f} tokens/s"
              + (f"  (after {len(out['failures'])} restart(s))" if out.get("failures") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
