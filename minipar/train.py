"""The training loop: one optimizer step, the run, and the supervisor that restarts it.

Chapter "From a laptop to a cluster". The same seed, model and global batch give the same
loss curve for every layout: each rank builds the same full model from the seed and keeps
its piece (`parallelize`), reads the same global batch and keeps its slice, and the loss is
a sum over tokens divided by the *global* token count, so summing gradients over ranks gives
exactly the single-device gradient.

`python -m minipar.train` runs `main` (its flags are generated in `cli.py` from the config
dataclasses); `train(cfg)` does the same from Python.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from . import checkpoint, cli, comm, export, hf, launch, profile
from .config import ConfigError, TrainConfig
from .data import local_microbatches, make_source
from .flops import mfu
from .grid import ProcessGrid
from .memory import ActivationMeter, cuda_peak_bytes, fullest_rank, state_bytes
from .parallel.context import shard_sequence
from .parallel.data import DataParallel
from .parallel.pipeline import pipeline_forward_backward, sync_tied_gradients, write_trace
from .parallelize import parallelize
from .peak import peak_flops
from .preflight import check_run

__all__ = ["TrainConfig", "train", "main"]


# ---------------------------------------------------------------- the optimizer
def adamw(pairs, lr: float, weight_decay: float, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW over what this rank updates: whole parameters, or (ZeRO) its shards of them,
    which is all that "sharding the optimizer state" means. Weight decay on matrices only,
    not on norms, as in Llama; a shard is flat, so ask its parameter."""
    decay = [x for x, p in pairs if p.dim() >= 2]
    no_decay = [x for x, p in pairs if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=1e-8)


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


def clip_grad_norm_(dp: DataParallel, grid: ProcessGrid, max_norm: float) -> float:
    """Scale every gradient this rank holds so that the global norm is at most `max_norm`;
    return the norm before clipping. Copies of one gradient (over DP without ZeRO, over TP
    for norms, a tied embedding) are counted once: `grid.counts`."""
    sq = torch.zeros((), dtype=torch.float64, device=launch.device())
    for g, p in dp.grads():
        if grid.counts(p, dp.holds_replicas):
            sq += g.detach().double().pow(2).sum()
    comm.all_reduce(sq, grid.world)
    norm = sq.sqrt().item()
    scale = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
    if scale < 1.0:
        for g, _ in dp.grads():
            g.mul_(scale)
    return norm


# ---------------------------------------------------------------- one step
def forward_backward(model, micro, n_tokens, pcfg, grid, trace=None) -> torch.Tensor:
    """Every micro-batch forward and backward; returns this rank's share of the loss."""
    if pcfg.pp > 1:
        return pipeline_forward_backward(model.chunks, micro, model.loss_fn, n_tokens,
                                         model.dp, pcfg, grid, trace)
    total = torch.zeros((), device=micro[0].device)
    for i, mb in enumerate(micro):
        model.dp.set_last_microbatch(i == len(micro) - 1)
        x, y, pos = shard_sequence(mb[:, :-1], mb[:, 1:], grid.cp)
        with profile.span(f"F mb{i}", kind="F", microbatch=i):
            loss = model.loss_fn(model.chunks[0](x, pos), y) / n_tokens
        with profile.span(f"B mb{i}", kind="B", microbatch=i):
            loss.backward()
        total += loss.detach()
    return total


class Trainer:
    """One rank's run: its place in the grid, its piece of the model, its optimizer and its
    data. `step(i)` is one optimizer step, the loop's body."""

    def __init__(self, cfg: TrainConfig):
        self.cfg, self.pcfg, self.mcfg = cfg, cfg.parallel, cfg.model_config()
        p = self.pcfg
        self.grid = ProcessGrid(p.tp, p.cp, p.pp, p.dp, dist.get_rank()).init_groups()
        self.device = launch.device()
        self.model = parallelize(self.mcfg, p, self.grid, cfg.seed, self.device)
        if cfg.init_hf:      # a Hugging Face model's weights: each rank reads its slices
            hf.load_weights(cfg.init_hf, self.model.chunks, self.mcfg, self.model.dp.shard_of,
                            self.grid.tp.rank, self.grid.tp.size)
        if compute_dtype(cfg, self.device) == torch.bfloat16:
            # mixed precision: weights, gradients and optimizer state stay fp32 (the master
            # copy); matmuls run in bf16 inside each chunk's forward
            for m in self.model.chunks:
                m.forward = torch.autocast(self.device.type, dtype=torch.bfloat16)(m.forward)
        self.optimizer = adamw(self.model.dp.optimizer_params(), cfg.lr, cfg.weight_decay)
        self.source = make_source(cfg.data, self.mcfg.vocab_size, cfg.seed,
                                  hf.tokenizer_file(cfg.init_hf))
        self.n_tokens = cfg.global_batch * cfg.seq_len
        self.trace = [] if cfg.trace else None
        if cfg.profile:
            profile.trace_layers(self.model.chunks)     # per-layer spans while recording
        self.probes: dict[int, object] = {}

    def step(self, step: int) -> dict:
        """One optimizer step: this rank's micro-batches forward and backward, the
        gradients summed over dp x cp, clipped and applied. Returns the step's record."""
        cfg, grid, dp = self.cfg, self.grid, self.model.dp
        comm.LOG.reset()
        t0 = time.perf_counter()
        batch = self.source.batch(step, cfg.global_batch, cfg.seq_len).to(self.device)
        micro = local_microbatches(batch, grid.dp.rank, self.pcfg.dp, self.pcfg.microbatches)
        dp.start_step()
        with ActivationMeter() as saved:     # what autograd keeps for the backward
            loss = forward_backward(self.model, micro, self.n_tokens, self.pcfg, grid, self.trace)
        dp.finish_backward()          # every gradient summed over dp x cp (or my shard of it)
        if self.pcfg.pp > 1 and self.mcfg.tie_embeddings:
            sync_tied_gradients(self.model.chunks, dp, grid)   # embedding (first) = head (last)
        self.probe(step)
        norm = clip_grad_norm_(dp, grid, cfg.clip)
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = global_loss(loss, grid)      # the same number on every rank, as is the norm
        finite = check_finite(step, loss, norm, cfg.skip_nonfinite)
        with profile.span("optimizer", kind="optimizer"):
            if finite:                # else: --skip-nonfinite, no update from this batch
                self.optimizer.step()
        dp.after_optimizer_step()     # ZeRO 1/2: every rank gathers the updated weights
        rec = step_record(step, loss, norm, lr, time.perf_counter() - t0, self)
        if not finite:
            rec["skipped"] = True
        rec["memory"] = fullest_rank({**self.memory_bytes(), "activations": saved.peak}, grid)
        return rec

    def probe(self, step: int):
        """`TrainConfig.after_backward`: a look at the reduced gradients (the tests')."""
        if self.cfg.after_backward is not None:
            out = self.cfg.after_backward(step, self.model.chunks, self.model.dp, self.grid)
            if out is not None:
                self.probes[step] = out

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds in parameters, gradients and optimizer state, counted
        from the tensors themselves, between steps."""
        out = state_bytes(self.model.dp, self.optimizer)
        peak = cuda_peak_bytes(self.device)     # everything the allocator held, on CUDA
        return out if peak is None else {**out, "cuda_max_allocated": peak}


class NonFinite(RuntimeError):
    """The loss or the gradient norm of a step is NaN or infinite (and not --skip-nonfinite)."""

    def __init__(self, step: int, loss: float, norm: float):
        super().__init__(f"step {step}: loss {loss} / gradient norm {norm} is not finite; "
                         "stopped before the update (--skip-nonfinite skips such steps)")
        self.step = step


def check_finite(step: int, loss: float, norm: float, skip: bool) -> bool:
    """True when the step may update the weights. Both numbers are all-reduced, so every
    rank decides the same: all stop (`NonFinite`), or all skip the update (`skip`)."""
    if math.isfinite(loss) and math.isfinite(norm):
        return True
    if skip:
        return False
    raise NonFinite(step, loss, norm)


def global_loss(loss: torch.Tensor, grid: ProcessGrid) -> float:
    """Every rank holds part of the loss (its tokens; the last pipeline stage only), and
    the TP ranks of a group all hold the same part: count it once and sum."""
    if grid.tp.rank != 0:
        loss = torch.zeros_like(loss)
    with comm.paused():
        comm.all_reduce(loss, grid.world)
    return loss.item()


# ---------------------------------------------------------------- the loop, per rank
def train_on_rank(cfg: TrainConfig, report: bool = False) -> dict:
    """What every rank runs. Returns its records (rank 0's only), probes and memory."""
    run = Trainer(cfg)
    rank, start, records = run.grid.rank, 0, []
    if cfg.resume:       # the weights and optimizer state of a checkpoint, in this layout
        start, records = checkpoint.load(cfg.resume, run.model.chunks, run.model.dp,
                                         run.optimizer, run.grid, run.mcfg)
    log = JsonLog(cfg.log_json, records) if (cfg.log_json and rank == 0) else None
    if cfg.profile:
        profile.start(rank)
    note = resume_note(cfg, start) if (cfg.resume and rank == 0) else None
    ended = run_steps(run, start, records, log, note, report or cfg.progress)
    if log:
        log.close()
    if cfg.trace and not ended:
        write_trace(cfg.trace, run.trace, run.grid)
    if cfg.export_hf and not ended:    # the trained model as a Hugging Face directory (rank 0 writes)
        export.export_run(cfg.export_hf, run.model.chunks, run.model.dp, run.optimizer,
                          run.grid, run.mcfg, tokenizer_dir=cfg.init_hf)
    return {"records": records if rank == 0 else None, "probes": run.probes,
            "memory": run.memory_bytes(), "coords": run.grid.coords(rank),
            "comm": comm.LOG.summary(), "ended": ended,
            "profile": None if ended else finish_profile(cfg, run)}


def run_steps(run: Trainer, start: int, records: list, log, note: dict | None,
              report: bool = False) -> dict | None:
    """The loop from step `start`. Returns None when every step ran, else why it ended
    early: a stop signal that every rank agreed on at a step boundary (after a checkpoint,
    on SIGTERM with --save), or a step that was not finite."""
    cfg, rank, saved_at = run.cfg, run.grid.rank, None
    steps = progress_bar(range(start, cfg.steps), cfg, rank)
    for step in steps:
        signum = agreed_stop(run.grid)
        if signum:
            return stop_at(run, step, signum, records, saved_at, start)
        maybe_fail(cfg, step, rank, report)
        try:
            with profile.span(f"step {step}", cat="step", step=step):
                rec = run.step(step)
        except NonFinite as e:       # every rank raised it at the same step
            return {"reason": "nonfinite", "step": e.step, "message": str(e)}
        if note:                     # the first record after a resume says where from
            rec["resume"], note = note, None
        records.append(rec)
        if log:
            log.write(rec)
        if checkpoint_due(cfg, step + 1):
            checkpoint.save(cfg.save, step + 1, run.model.chunks, run.model.dp, run.optimizer,
                            run.grid, cfg, records)
            saved_at = step + 1
        if hasattr(steps, "set_postfix"):
            steps.set_postfix(loss=f"{rec['loss']:.4f}")
    return None


def agreed_stop(grid: ProcessGrid) -> int:
    """Collective, at every step boundary: the stop signal any rank has received (0:
    none). A signal reaches the ranks at different moments, mid-step; the MAX over the
    world is the same everywhere, so every rank stops at the same step."""
    flag = torch.tensor(float(launch.stop_requested()), device=launch.device())
    with comm.paused():
        comm.all_reduce(flag, grid.world, op="max")
    return int(flag.item())


def stop_at(run: Trainer, step: int, signum: int, records: list, saved_at, start: int) -> dict:
    """Stop after `step` steps. A --save run first checkpoints what it did since its last
    checkpoint: on SIGTERM (a preemption: the job will be restarted) and on Ctrl-C alike
    (a second Ctrl-C to the launcher stops at once, without one)."""
    cfg, path = run.cfg, None
    if cfg.save and step > start:
        path = os.path.join(cfg.save, checkpoint.step_dir_name(step)) if saved_at == step else \
            checkpoint.save(cfg.save, step, run.model.chunks, run.model.dp, run.optimizer,
                            run.grid, cfg, records)
    return {"reason": "signal", "signal": signum, "step": step, "checkpoint": path}


def resume_note(cfg: TrainConfig, start: int) -> dict:
    """What the log records of a resume: from where, at which step, and what changed in
    the run's meaning (allowed by --resume-allow-change)."""
    manifest = checkpoint.read_manifest(checkpoint.resolve(cfg.resume))
    return {"from": cfg.resume, "step": start,
            "changed": checkpoint.meaning_changes(manifest, cfg)}


def finish_profile(cfg: TrainConfig, run: Trainer) -> dict | None:
    """--profile DIR: every rank's spans into one trace file (rank 0 writes it); rank 0
    gets back its path and each axis' hidden and exposed communication (from step 1 on:
    step 0 warms up)."""
    if not cfg.profile:
        return None
    model = f"--init-hf {cfg.init_hf}" if cfg.init_hf else cfg.model     # what really ran
    meta = {"layout": run.pcfg.as_dict(), "model": model, "seq_len": cfg.seq_len,
            "global_batch": cfg.global_batch, "steps": cfg.steps,
            "backend": dist.get_backend(), "device": run.device.type, "torch": torch.__version__}
    trace = profile.finish(cfg.profile, run.grid.coords(run.grid.rank), meta)
    if trace is None:
        return None
    steps = sorted(profile.step_windows(trace, 0))      # a resumed run starts later
    return {"path": str(profile.trace_path(cfg.profile)), "backend": meta["backend"],
            "exposure": profile.exposure(trace, from_step=steps[min(1, len(steps) - 1)]
                                         if steps else 0)}


def progress_bar(steps, cfg: TrainConfig, rank: int):
    """A tqdm bar on rank 0 (the only rank that prints)."""
    if rank != 0 or not cfg.progress:
        return steps
    p = cfg.parallel
    return tqdm(steps, desc=f"train {p.tp}x{p.cp}x{p.pp}x{p.dp}", leave=False)


class JsonLog:
    """`--log-json`: one JSON object per step. A resumed run rewrites the file from the
    checkpoint's records, so the whole curve is there once, however often it was stopped."""

    def __init__(self, path: str, history: list[dict]):
        self.file = open(path, "w")
        for rec in history:
            self.write(rec)

    def write(self, rec: dict):
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()

    def close(self):
        self.file.close()


def checkpoint_due(cfg: TrainConfig, done: int) -> bool:
    """After `done` steps: every --save-every steps, and at the end."""
    return bool(cfg.save) and (done == cfg.steps or (cfg.save_every > 0 and done % cfg.save_every == 0))


def maybe_fail(cfg: TrainConfig, step: int, rank: int, report: bool = True):
    """--fail-at-step K --fail-rank R: rank R dies at the start of step K, the way a GPU
    that falls off the bus does: no exception, no word to its peers, just gone."""
    if cfg.fail_at_step == step and rank == (cfg.fail_rank or 0):
        if report:
            print(f"rank {rank}: injected failure at step {step} (--fail-at-step)", file=sys.stderr, flush=True)
        os._exit(1)


def compute_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "bf16" or (cfg.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def step_record(step: int, loss: float, norm: float, lr: float, dt: float, run: Trainer) -> dict:
    """The `--log-json` object of one step."""
    tps = run.n_tokens / dt
    rec = {"step": step, "loss": loss, "grad_norm": norm, "lr": lr, "step_time_s": dt,
           "tokens_per_s": tps, "mfu": None, "comm": comm.LOG.summary()}
    if run.cfg.peak_flops:
        # on a CPU the measured peak is the whole machine's, which the forked ranks share;
        # on GPUs each rank has a peak of its own
        n_dev = run.grid.world_size if run.device.type == "cuda" else 1
        rec["mfu"] = mfu(tps, run.mcfg, run.cfg.seq_len, run.cfg.peak_flops, n_devices=n_dev)
    return rec


# ---------------------------------------------------------------- the run and its restarts
def train(cfg: TrainConfig, report: bool = False) -> dict:
    """Check, then run on tp*cp*pp*dp ranks (forked locally, or this torchrun world).
    Returns rank 0's result: {"records": [...], "probes": ..., "memory": ...}, and
    "all": every rank's result when run locally, "failures": the restarts it survived.

    --max-restarts N: when a rank fails, start a fresh world from the latest checkpoint,
    up to N times. Under torchrun, restarting is torchrun's job (its own --max-restarts);
    a restarted worker sees TORCHELASTIC_RESTART_COUNT > 0 and resumes the same way.

    `report` (the command line's): an injected failure and each restart also say so on
    stderr, bar or no bar; from Python they are in "failures" (and on the bar's stderr)."""
    check_run(cfg)
    if cfg.peak_flops is None:
        cfg.peak_flops = peak_flops()
    if launch.in_torchrun() and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and cfg.save:
        cfg = restarted(cfg)
    failures = []
    while True:
        try:
            results = launch.run(train_on_rank, cfg.parallel.world_size, cfg, report=report,
                                 timeout_s=cfg.timeout_s, stop_grace_s=cfg.stop_grace_s)
            break
        except launch.RankFailed as e:
            if len(failures) >= cfg.max_restarts or launch.in_torchrun():
                raise
            cfg = restarted(cfg)
            failures.append({"rank": e.rank, "error": str(e).splitlines()[0], "resumed_from": cfg.resume,
                             "resumed_at_step": checkpoint.step_of(cfg.resume)})
            if report or cfg.progress:
                print(f"{failures[-1]['error']}\nrestart {len(failures)}/{cfg.max_restarts} "
                      f"from {cfg.resume or 'the start'}", file=sys.stderr, flush=True)
    return {**results[0], "all": results, "failures": failures}


def restarted(cfg: TrainConfig) -> TrainConfig:
    """The run a restart makes: it resumes from the newest checkpoint of --save (or, if
    there is none yet, from where the first attempt started), and the injected fault, a
    one-time event like a real one, is not injected again."""
    resume = cfg.save if checkpoint.latest(cfg.save) else cfg.resume
    return check_run(dataclasses.replace(cfg, resume=resume, fail_at_step=None, fail_rank=None))


def main(argv=None) -> int:
    """`python -m minipar.train`: flags in (`cli.parse`), one run, one line out. A bad
    flag exits 2 before any rank starts; a failed rank exits 1 naming it; a non-finite step
    exits 1 naming it; SIGTERM / SIGINT exit 128 + the signal, one line, nothing left running."""
    cfg = cli.parse(argv)
    with cli.stop_on_signals():
        try:
            out = train(cfg, report=True)    # check_run first: bad input exits 2 before any rank
        except ConfigError as e:
            return cli.error(e)
        except launch.RankFailed as e:
            return cli.error(e, status=1, detail=True)
        except launch.Stopped as e:
            return cli.error(e, status=128 + e.signum, prefix="")
    if out.get("ended"):
        return cli.report_end(out["ended"], rank0=out["records"] is not None)
    cli.print_summary(out)
    if out.get("profile"):
        print(f"trace: {out['profile']['path']} (open it in ui.perfetto.dev)")
        print(profile.format_exposure(out["profile"]["exposure"], out["profile"]["backend"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
