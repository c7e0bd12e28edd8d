"""A run: everything around the training loop. Starting the ranks and restarting them when
one dies (`train`), resuming and saving checkpoints, the JSON log, fault injection, the
trace and export (`RankRun`), and the command line's one-line endings (`main`).

Chapter "From a laptop to a cluster". The step is the trainer's (`trainer/step.py`); the
loop around it is here: `train(cfg)` runs `train_on_rank` on every rank, and
`python -m minipar.train` is `main` (its flags are generated in `plan/flags.py` from the
config dataclasses).
"""

import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..plan import flags, traces
from ..plan.config import ConfigError, TrainConfig
from ..trainer import comm, events, profile
from ..trainer.grid import ProcessGrid
from ..trainer.step import NonFinite, Trainer
from . import checkpoint, hf, launch, peak
from .preflight import check_run


# ---------------------------------------------------------------- the run and its restarts
def train(cfg: TrainConfig, report: bool = False, after_backward=None) -> dict:
    """Check, then train (`train_on_rank`) on tp*cp*pp*dp ranks (forked locally, or this
    torchrun world). Returns rank 0's result: {"records": [...], "probes": ..., "memory": ...,
    "all": every rank's result when run locally, "failures": the restarts it survived}.
    `after_backward(step, chunks, dp, grid)`, when given, looks at every rank's reduced
    gradients (`Trainer.probe`; the tests' `testing.capture_grads`).

    --max-restarts N: when a rank fails, start a fresh world from the latest checkpoint,
    up to N times. Under torchrun, restarting is torchrun's job (its own --max-restarts);
    a restarted worker sees TORCHELASTIC_RESTART_COUNT > 0 and resumes the same way.

    `report` (the command line's): an injected failure and each restart also say so on
    stderr, bar or no bar; from Python they are in "failures" (and on the bar's stderr)."""
    cfg = check_run(cfg)    # a new TrainConfig: with --init-hf's model read
    if cfg.peak_flops is None:
        cfg.peak_flops = peak.peak_flops()
    if cfg.save and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)):    # torchrun's restart
        cfg = restarted(cfg)
    each_rank, failures = functools.partial(train_on_rank, after_backward=after_backward), []
    # --save DIR is this run's until it returns; under torchrun rank 0's, which commits
    with checkpoint.claim(cfg.save) if cfg.save and os.environ.get("RANK", "0") == "0" \
            else contextlib.nullcontext():
        while True:
            try:
                results = launch.run(each_rank, cfg.parallel.world_size, cfg, report=report,
                                     timeout_s=cfg.timeout_s, stop_grace_s=cfg.stop_grace_s)
                return {**results[0], "all": results, "failures": failures}
            except launch.RankFailed as e:
                if len(failures) >= cfg.max_restarts or launch.in_torchrun():
                    raise
                cfg, error = restarted(cfg), str(e).splitlines()[0]
                failures.append({"rank": e.rank, "error": error, "resumed_from": cfg.resume,
                                 "resumed_at_step": checkpoint.step_of(cfg.resume)})
                if report or cfg.progress:
                    print(f"{error}\nrestart {len(failures)}/{cfg.max_restarts} from "
                          f"{cfg.resume or 'the start'}", file=sys.stderr, flush=True)


def restarted(cfg: TrainConfig) -> TrainConfig:
    """The run a restart makes: it resumes from the newest checkpoint of --save (or, if
    there is none yet, from where the first attempt started), and the injected fault, a
    one-time event like a real one, is not injected again."""
    resume = cfg.save if checkpoint.latest(cfg.save) else cfg.resume
    return check_run(dataclasses.replace(cfg, resume=resume, fail_at_step=None, fail_rank=None))


# ---------------------------------------------------------------- around one rank's loop
class RankRun:
    """What one rank does around the loop of a `Trainer` (`trainer`): resume from a
    checkpoint, log each step (rank 0), save checkpoints, inject the teaching failure, and
    at the end (a run that was not stopped) export the model and write the trace."""

    def __init__(self, t: Trainer, report: bool = False):
        cfg, self.trainer, self.report = t.cfg, t, report
        self.rank, self.start, self.records = t.grid.rank, 0, []
        if cfg.resume:       # the weights and optimizer state of a checkpoint, in this layout
            self.start, self.records = checkpoint.load(cfg.resume, t.model.chunks, t.model.dp,
                                                       t.optimizer, t.grid, t.mcfg)
        # line-buffered: each step's record is on disk as soon as it is written
        self.log = open(cfg.log_json, "w", buffering=1) if cfg.log_json and self.rank == 0 else None
        for rec in self.records if self.log else ():   # a resumed run rewrites the log whole
            self.log.write(json.dumps(rec) + "\n")
        self.note = self.resumed() if cfg.resume and self.rank == 0 else None
        self.saved_at = None                    # the step of the last checkpoint written
        p, self.steps = cfg.parallel, range(self.start, cfg.steps)
        if self.rank == 0 and cfg.progress:
            self.steps = tqdm(self.steps, desc=f"train {p.tp}x{p.cp}x{p.pp}x{p.dp}", leave=False)
        if cfg.profile:
            profile.start()

    def resumed(self) -> dict:
        """Where a resumed run comes from, said on the terminal (with the layout it was
        saved in); returns what the log records of it: from where, at which step, and what
        changed in the run's meaning (allowed by --resume-allow-change)."""
        cfg = self.trainer.cfg
        step_dir = checkpoint.resolve(cfg.resume)
        manifest = checkpoint.read_manifest(step_dir)
        now, then = layout(cfg.parallel.as_dict()), layout(manifest["layout"])
        self.say(f"resumed {step_dir} at step {self.start}" + (
            f" (layout {now} unchanged)" if then == now else f", resharded from {then} to {now}"))
        return {"from": cfg.resume, "step": self.start,
                "changed": checkpoint.meaning_changes(manifest, cfg)}

    def before(self, step: int):
        """--fail-at-step K --fail-rank R: rank R dies at the start of step K, the way a GPU
        that falls off the bus does: no exception, no word to its peers, just gone."""
        cfg = self.trainer.cfg
        if cfg.fail_at_step == step and self.rank == (cfg.fail_rank or 0):
            if self.report or cfg.progress:
                print(f"rank {self.rank}: injected failure at step {step} (--fail-at-step)",
                      file=sys.stderr, flush=True)
            os._exit(1)

    def after(self, step: int, rec: dict):
        """A step is done: its record (with the resume it follows), the log, a checkpoint."""
        cfg, done = self.trainer.cfg, step + 1
        if self.note:
            rec["resume"], self.note = self.note, None
        self.records.append(rec)
        if self.log:
            self.log.write(json.dumps(rec) + "\n")
        if hasattr(self.steps, "set_postfix"):
            self.steps.set_postfix(loss=f"{rec['loss']:.4f}")
        if cfg.save and (done == cfg.steps or cfg.save_every and done % cfg.save_every == 0):
            return self.save(done)      # None, or why the run ends here

    def save(self, step: int) -> dict | None:
        """Checkpoint `step`. Returns None, or (every rank learns it in the save: a full
        disk, say) the end of the run: one line, the checkpoint before kept."""
        t = self.trainer
        try:
            path = checkpoint.save(t.cfg.save, step, t.model.chunks, t.model.dp, t.optimizer,
                                   t.grid, t.cfg, self.records)
        except checkpoint.CheckpointError as e:
            return {"reason": "save", "step": step, "message": str(e)}
        self.saved_at = step
        self.say(f"saved {path} (step {step}, layout {layout(t.pcfg.as_dict())})")

    def say(self, line: str):
        """A line for the person at the terminal: rank 0, with the progress bar on."""
        if self.rank == 0 and self.trainer.cfg.progress:
            tqdm.write(line, file=sys.stderr)

    def finish(self, ended: dict | None) -> dict:
        """This rank's result. A run stopped by a signal first checkpoints (with --save)
        what it did since its last checkpoint: on SIGTERM (a preemption: the job will be
        restarted) and on Ctrl-C alike; a run that ended normally exports and writes the
        trace."""
        t, cfg = self.trainer, self.trainer.cfg
        if self.log:
            self.log.close()
        if ended and ended["reason"] == "signal":
            stop, ended["checkpoint"] = ended["step"], None
            if cfg.save and stop > self.start:     # (a save that fails ends it as its own)
                ended = (self.saved_at != stop and self.save(stop)) or \
                    {**ended, "checkpoint": os.path.join(cfg.save, checkpoint.step_dir_name(stop))}
        if cfg.export_hf and not ended:    # the trained model as a Hugging Face directory
            hf.export_run(cfg.export_hf, t.model.chunks, t.model.dp, t.optimizer, t.grid,
                          t.mcfg, tokenizer_dir=cfg.init_hf)
        return {"records": self.records if self.rank == 0 else None, "probes": t.probes,
                "memory": t.memory_bytes(), "coords": t.grid.coords(self.rank),
                "comm": comm.LOG.summary(), "ended": ended,
                "profile": finish_profile(t) if cfg.profile and not ended else None}


def layout(d: dict) -> str:
    """A layout (`ParallelConfig.as_dict()`, as a checkpoint's manifest keeps it) in one line."""
    return " ".join(f"{k}={d[k]}" for k in ("tp", "cp", "pp", "dp", "zero"))


def finish_profile(t) -> dict | None:
    """--profile DIR: every rank's events into one trace file (rank 0 writes it); rank 0
    gets back its path and each axis' hidden and exposed communication (from step 1 on:
    step 0 warms up)."""
    cfg = t.cfg
    meta = {"layout": t.pcfg.as_dict(), "seq_len": cfg.seq_len, "global_batch": cfg.global_batch,
            "model": f"--init-hf {cfg.init_hf}" if cfg.init_hf else cfg.model,    # what really ran
            "model_shape": dataclasses.asdict(t.mcfg),        # what a replay scales from
            "steps": cfg.steps, "backend": dist.get_backend(), "device": t.device.type,
            "torch": torch.__version__}
    trace = profile.finish(cfg.profile, t.grid.coords(t.grid.rank), meta)
    if trace is None:
        return None
    steps = sorted(traces.step_windows(trace, 0))      # a resumed run starts later
    return {"path": str(traces.trace_path(cfg.profile)), "backend": meta["backend"],
            "exposure": traces.exposure(trace, from_step=steps[min(1, len(steps) - 1)]
                                         if steps else 0)}


# ---------------------------------------------------------------- the command line
def main(argv=None) -> int:
    """`python -m minipar.train`: flags in (`flags.parse`), one run (`train`), one line out.
    A bad flag exits 2 before any rank starts; a failed rank exits 1 naming it; a
    non-finite step exits 1 naming it; SIGTERM / SIGINT exit 128 + the signal, one line,
    nothing left running."""
    cfg = flags.parse(argv)
    with stop_on_signals():
        try:
            out = train(cfg, report=True)    # check_run first: bad input exits 2 before any rank
        except ConfigError as e:
            return error(e)
        except launch.RankFailed as e:
            return error(e, status=1, detail=True)
        except launch.Stopped as e:
            return error(e, status=128 + e.signum, prefix="")
    if out.get("ended"):
        return report_end(out["ended"], rank0=out["records"] is not None)
    if out["records"]:                # rank 0's: the last step's loss, norm and throughput
        last = out["records"][-1]
        restarts = f"  (after {len(out['failures'])} restart(s))" if out["failures"] else ""
        print(f"step {last['step']}: loss {last['loss']:.6f}  grad_norm {last['grad_norm']:.4f}"
              f"  {last['tokens_per_s']:.0f} tokens/s" + restarts)
    if out.get("profile"):
        print(f"trace: {out['profile']['path']} (open it in ui.perfetto.dev)")
        print(traces.format_exposure(out["profile"]["exposure"], out["profile"]["backend"]))
    return 0


def error(e, status: int = 2, detail: bool = False, prefix: str = "error: ") -> int:
    """Print `e`'s first line (an exception's, or a message) as the CLI's error (and, with
    `detail`, the rest); return the exit status."""
    first, *rest = str(e).splitlines() or [""]
    print(f"{flags.PROG}: {prefix}{first}", file=sys.stderr)
    if detail and rest:
        print("\n".join(rest), file=sys.stderr)
    return status


@contextlib.contextmanager
def stop_on_signals():
    """While no rank runs (checks, restarts), SIGTERM and SIGINT end the command at once
    with `launch.Stopped`: one line, not a KeyboardInterrupt traceback. While ranks run,
    the launcher's own handlers take over (they pass the signal on to the ranks)."""
    def stop(signum, frame):
        raise launch.Stopped(signum, "before any rank started")
    old = {s: signal.signal(s, stop) for s in launch.STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def report_end(ended: dict, rank0: bool = True) -> int:
    """The one line of a run that ended early, on stderr; its exit status: 128 + signal
    for a stop (143 SIGTERM, 130 SIGINT), 1 for a non-finite step or a failed checkpoint."""
    if ended["reason"] != "signal":       # a step that was not finite; a failed save
        return error(ended["message"], status=1) if rank0 else 1
    saved = (f"checkpoint saved to {ended['checkpoint']} (continue with --resume)" if
             ended["checkpoint"] else "no checkpoint (with --save, SIGTERM or Ctrl-C writes one)")
    if rank0:
        say(f"{flags.PROG}: stopped by {signal.Signals(ended['signal']).name} after "
            f"{ended['step']} steps, every rank at the same step boundary; {saved}")
    return 128 + ended["signal"]


# Set by `python -m minipar.torchrun` for its workers: rank 0 leaves its one line of a
# stopped run in this file, and the agent prints it once its workers are gone, so that
# a signal to the agent ends with that one line (not rank 0's line and then the agent's).
END_LINE_ENV = "MINIPAR_END_LINE_FILE"


def say(line: str) -> None:
    """The stopped run's one line: on stderr, or to the torchrun wrapper's file."""
    path = os.environ.get(END_LINE_ENV)
    if path and launch.in_torchrun():
        with open(path, "w") as f:
            f.write(line + "\n")
    else:
        print(line, file=sys.stderr)


# ---------------------------------------------------------------- the loop
def agreed_stop(grid: ProcessGrid) -> int:
    """Collective, at every step boundary: the stop signal any rank has received (0:
    none). A signal reaches the ranks at different moments, mid-step; the MAX over the
    world is the same everywhere, so every rank stops at the same step."""
    flag = torch.tensor(float(launch.stop_requested()), device=comm.device())
    with comm.paused():
        comm.all_reduce(flag, grid.world, op="max")
    return int(flag.item())


def train_steps(trainer: Trainer, steps, before, after) -> dict | None:
    """The loop over `steps` (an iterable of step numbers): `before(step)` and, with the
    step's record, `after(step, record)` around each step. Returns None when every step
    ran, else why the loop ended early: a stop signal every rank agreed on at a step
    boundary, a step that was not finite, or what `after` returned (a failed checkpoint)."""
    for step in steps:
        if signum := agreed_stop(trainer.grid):
            return {"reason": "signal", "signal": signum, "step": step}
        before(step)
        try:
            with events.span(f"step {step}", cat="step", step=step):
                rec = trainer.step(step)
        except NonFinite as e:       # every rank raised it at the same step
            return {"reason": "nonfinite", "step": e.step, "message": str(e)}
        if ended := after(step, rec):     # a checkpoint that could not be written
            return ended
    return None


def train_on_rank(cfg: TrainConfig, report: bool = False, after_backward=None) -> dict:
    """What every rank runs: the loop, with what `RankRun` does around it (resume, log,
    checkpoints, the teaching failure, export, the trace). Returns the rank's result."""
    weights = functools.partial(hf.load_weights, cfg.init_hf) if cfg.init_hf else None
    trainer = Trainer(cfg, weights, hf.tokenizer_file(cfg.init_hf), after_backward)
    around = RankRun(trainer, report)
    return around.finish(train_steps(trainer, around.steps, around.before, around.after))
