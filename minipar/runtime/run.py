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
import errno
import fcntl
import functools
import json
import os
import re
import signal
import stat
import sys

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..plan import flags, traces
from ..plan.config import ConfigError, TrainConfig
from ..trainer import comm, events, profile
from ..trainer.grid import ProcessGrid
from ..trainer.step import MAX_SKIPPED_IN_ROW, NonFinite, Trainer
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
    stderr, bar or no bar; from Python they are in "failures" (and on the bar's stderr).

    --resume names `latest` once, here: every rank loads that one step directory
    (`resume_dir`), never `latest` on its own while a run moves it. Restarts stop when they
    cannot help: the same failure twice from the same checkpoint (one that cannot load, a
    fault at a step it reaches again), or a --data file that changed under the run."""
    step_dir = resume_dir(cfg)
    cfg = checked(cfg, step_dir)    # a new TrainConfig: with --init-hf's model read
    if cfg.peak_flops is None:
        cfg.peak_flops = peak.peak_flops()
    if cfg.save and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)):    # torchrun's restart
        cfg, step_dir = restarted(cfg, step_dir)
    failures, seen = [], set()
    # --save DIR is this run's until it returns; under torchrun rank 0's, which commits
    with checkpoint.claim(cfg.save) if cfg.save and os.environ.get("RANK", "0") == "0" \
            else contextlib.nullcontext():
        while True:
            each_rank = functools.partial(train_on_rank, after_backward=after_backward,
                                          step_dir=step_dir)
            try:
                results = launch.run(each_rank, cfg.parallel.world_size, cfg, report=report,
                                     timeout_s=cfg.timeout_s, stop_grace_s=cfg.stop_grace_s)
                return {**results[0], "all": results, "failures": failures}
            except launch.RankFailed as e:
                cfg, step_dir = restart_or_raise(e, cfg, step_dir, failures, seen)
                if report or cfg.progress:
                    print(f"{failures[-1]['error']}\nrestart {len(failures)}/{cfg.max_restarts} "
                          f"from {step_dir or 'the start'}", file=sys.stderr, flush=True)


def restart_or_raise(e: launch.RankFailed, cfg: TrainConfig, step_dir: str | None,
                     failures: list, seen: set) -> tuple[TrainConfig, str | None]:
    """After a rank failed: the run to restart (`restarted`), noted in `failures`; or the
    failure raised when no restart can help: none left, torchrun's to do, a --data file
    that changed, or the same failure again from the same checkpoint (`seen`)."""
    if (data := data_failed(e, cfg)) is not None:
        raise data from None        # the same file again: no restart helps
    if len(failures) >= cfg.max_restarts or launch.in_torchrun():
        raise e
    cfg, step_dir = restarted(cfg, step_dir)
    error, at = str(e).splitlines()[0], checkpoint.step_of(step_dir)
    why = (at, re.sub(r"^rank \d+ ", "", error))    # whichever rank reported it
    if why in seen:
        raise launch.RankFailed(e.rank, f"the run failed twice at step {at} (each time resumed "
                                f"from {step_dir or 'the start'}, no checkpoint since): {error}; "
                                "not restarting") from None
    seen.add(why)
    failures.append({"rank": e.rank, "error": error, "resumed_from": cfg.resume,
                     "resumed_at_step": at})
    return cfg, step_dir


def resume_dir(cfg: TrainConfig) -> str | None:
    """The step directory --resume names, read once (a --save directory's `latest` moves
    while its run saves). A directory that another live run holds (`checkpoint.claim`) is
    refused: its `latest` may move, and a step it saves again is replaced, while this run
    reads it. Resuming from this run's own --save is its own business (its claim follows)."""
    if cfg.resume is None:
        return None
    given = os.path.normpath(cfg.resume)
    root = os.path.dirname(given) if os.path.isfile(os.path.join(given, checkpoint.MANIFEST)) \
        else given
    own = cfg.save is not None and os.path.realpath(root) == os.path.realpath(cfg.save)
    if not own and (who := checkpoint.held_by(root)):
        raise ConfigError(f"--resume {cfg.resume}: {root} is being written by a live run "
                          f"({who}): resume from it once that run has stopped")
    return checkpoint.resolve(cfg.resume)


def checked(cfg: TrainConfig, step_dir: str | None) -> TrainConfig:
    """`check_run` of the run its ranks will run, resuming from `step_dir` (what --resume
    named once), with --resume as it was given (the log records where it came from)."""
    return dataclasses.replace(check_run(dataclasses.replace(cfg, resume=step_dir)),
                               resume=cfg.resume)


def restarted(cfg: TrainConfig, step_dir: str | None) -> tuple[TrainConfig, str | None]:
    """The run a restart makes, and the step directory it resumes from: the newest
    checkpoint of --save (or, if there is none yet, `step_dir`, where the first attempt
    started); the injected fault, a one-time event like a real one, is not injected again."""
    newest = checkpoint.latest(cfg.save)
    resume, step_dir = (cfg.save, newest) if newest else (cfg.resume, step_dir)
    cfg = dataclasses.replace(cfg, resume=resume, fail_at_step=None, fail_rank=None)
    return checked(cfg, step_dir), step_dir


def data_failed(e: launch.RankFailed, cfg: TrainConfig) -> launch.RankFailed | None:
    """A rank killed by SIGBUS while the run reads --data (memory-mapped: `tokens.py`): the
    file was truncated under it. Said naming --data (None: some other failure)."""
    if e.exitcode != -signal.SIGBUS or cfg.data is None:
        return None
    rest = str(e).splitlines()[1:]
    return launch.RankFailed(e.rank, "\n".join([
        f"--data {cfg.data} was truncated or replaced while the run read it: rank {e.rank} was "
        "killed by SIGBUS (exit -7) reading its memory map; restore the file and resume",
        *rest]), exitcode=e.exitcode)


# ---------------------------------------------------------------- around one rank's loop
class RankRun:
    """What one rank does around the loop of a `Trainer` (`trainer`): resume from a
    checkpoint, log each step (rank 0), save checkpoints, inject the teaching failure, and
    at the end (a run that was not stopped) export the model and write the trace."""

    def __init__(self, t: Trainer, report: bool = False, step_dir: str | None = None):
        cfg, self.trainer, self.report = t.cfg, t, report
        self.rank, self.start, self.records = t.grid.rank, 0, []
        self.step_dir = agreed_step_dir(cfg, step_dir)
        if self.step_dir:    # the weights and optimizer state of a checkpoint, in this layout
            self.start, self.records = checkpoint.load(self.step_dir, t.model.chunks, t.model.dp,
                                                       t.optimizer, t.grid, t.mcfg)
        # rank 0's --log-json; a write that fails (a full disk, a reader gone) is `write_error`:
        # the ranks agree on it at the next step boundary and stop there
        self.log, self.logged, self.write_error = None, 0, None
        if cfg.log_json and self.rank == 0:
            try:
                self.log = open_log(cfg.log_json)
            except OSError as e:
                self.failed_write(e, 0)
        self.write_log(self.records, self.start)    # a resumed run rewrites the log whole
        self.note = self.resumed() if self.step_dir and self.rank == 0 else None
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
        cfg, step_dir = self.trainer.cfg, self.step_dir
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
        self.write_log([rec], step)
        if rec.get("skipped") and self.rank == 0:      # said on the terminal, bar or no bar
            line = (f"step {step}: loss {rec['loss']} / gradient norm {rec['grad_norm']} is not "
                    f"finite: skipped, no update (--skip-nonfinite; {self.trainer.skipped_in_row}"
                    f" in a row, at most {MAX_SKIPPED_IN_ROW})")
            (tqdm.write if self.trainer.cfg.progress else print)(line, file=sys.stderr)
        if hasattr(self.steps, "set_postfix"):
            self.steps.set_postfix(loss=f"{rec['loss']:.4f}")
        if cfg.save and (done == cfg.steps or cfg.save_every and done % cfg.save_every == 0):
            return self.save(done)      # None, or why the run ends here

    def write_log(self, records: list[dict], step: int):
        """Rank 0's records into --log-json, whole lines only: a write that fails leaves the
        file at its last complete line (not half a record) and the log closed, and says why
        in `write_error`."""
        if not self.log:
            return
        try:
            for rec in records:
                line = json.dumps(rec) + "\n"       # ASCII: its length is its bytes
                self.log.write(line)
                self.logged += len(line)
        except OSError as e:
            self.failed_write(e, step)

    def failed_write(self, e: OSError, step: int):
        path = self.trainer.cfg.log_json
        if self.log:
            with contextlib.suppress(OSError):       # what it still holds fails the same way
                self.log.close()
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.stat(path).st_mode):
                    os.truncate(path, self.logged)
        self.log = None
        why = {errno.ENXIO: "a FIFO with no reader", errno.EPIPE: "its reader has gone"}.get(
            e.errno, e.strerror or str(e))
        self.write_error = (f"--log-json {path}: cannot write the record of step {step}: {why}; "
                            f"the run stopped there, the log keeps the steps before it")

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
        restarted) and on Ctrl-C alike, and so does one whose --log-json failed (rank 0's
        write, agreed at a step boundary); a run that ended normally exports and writes the
        trace."""
        t, cfg = self.trainer, self.trainer.cfg
        if self.log:      # line-buffered: every line is written, there is nothing left to fail
            with contextlib.suppress(OSError):
                self.log.close()
        if ended and ended["reason"] in ("signal", "write"):   # a write: as a stop, saved
            stop, ended["checkpoint"] = ended["step"], None
            if cfg.save and stop > self.start:     # (a save that fails ends it as its own)
                ended = (self.saved_at != stop and self.save(stop)) or \
                    {**ended, "checkpoint": os.path.join(cfg.save, checkpoint.step_dir_name(stop))}
        if cfg.export_hf and not ended:    # the trained model as a Hugging Face directory
            try:
                hf.export_run(cfg.export_hf, t.model.chunks, t.model.dp, t.optimizer, t.grid,
                              t.mcfg, tokenizer_dir=cfg.init_hf)
            except hf.WriteError as e:     # every rank raises it (the export agrees): one line
                ended = {"reason": "export", "step": cfg.steps, "message": str(e)}
        return {"records": self.records if self.rank == 0 else None, "probes": t.probes,
                "memory": t.memory_bytes(), "coords": t.grid.coords(self.rank),
                "comm": comm.LOG.summary(), "ended": ended,
                "profile": finish_profile(t) if cfg.profile and not ended else None}


def open_log(path: str):
    """--log-json, opened for rank 0: truncated, line-buffered (each step's record is on
    disk as soon as it is written). The open never blocks: a FIFO with no reader fails
    (ENXIO) like a full disk, instead of a rank waiting forever for a reader."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, "w", buffering=1)


def agreed_step_dir(cfg: TrainConfig, step_dir: str | None) -> str | None:
    """The step directory every rank loads: the launcher's (`resume_dir`). Under torchrun
    each worker resolved it on its own, and rank 0's is the one (one broadcast)."""
    step_dir = step_dir or (checkpoint.resolve(cfg.resume) if cfg.resume else None)
    if cfg.resume and launch.in_torchrun():
        box = [step_dir]
        with comm.paused():
            dist.broadcast_object_list(box, src=0)
        step_dir = box[0]
    return step_dir


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
    try:
        trace = profile.finish(cfg.profile, t.grid.coords(t.grid.rank), meta)
    except OSError as e:        # rank 0, writing it (the gather is done): no half a trace left
        path = traces.trace_path(cfg.profile)
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.stat(path).st_mode):
                os.remove(path)
        return {"error": f"--profile {cfg.profile}: cannot write {path}: "
                         f"{e.strerror or e}; no trace written"}
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
    if (out.get("profile") or {}).get("error"):
        return error(out["profile"]["error"], status=1)
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
    if ended["reason"] == "write" and ended.get("checkpoint"):
        ended = {**ended, "message": f"{ended['message']}; checkpoint saved to "
                 f"{ended['checkpoint']} (continue with --resume)"}
    if ended["reason"] != "signal":     # a step that was not finite; a failed save or write
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
def agreed_stop(grid: ProcessGrid, failed: bool = False) -> tuple[int, bool]:
    """Collective, at every step boundary: the stop signal any rank has received (0:
    none), and whether any rank `failed` to write (rank 0's --log-json). A signal reaches
    the ranks at different moments, mid-step; the MAX over the world is the same
    everywhere, so every rank stops at the same step."""
    flag = torch.tensor([float(launch.stop_requested()), float(failed)], device=comm.device())
    with comm.paused():
        comm.all_reduce(flag, grid.world, op="max")
    return int(flag[0].item()), bool(flag[1].item())


def train_steps(trainer: Trainer, steps, before, after, write_error=lambda: None) -> dict | None:
    """The loop over `steps` (an iterable of step numbers): `before(step)` and, with the
    step's record, `after(step, record)` around each step. Returns None when every step
    ran, else why the loop ended early: a stop signal every rank agreed on at a step
    boundary, a write that failed (`write_error()`: rank 0's line), a step that was not
    finite (or, --skip-nonfinite, a run that ends on skipped steps with weights that are
    not), or what `after` returned (a failed checkpoint)."""
    rec, step = None, None
    for step in steps:
        signum, failed = agreed_stop(trainer.grid, write_error() is not None)
        if failed:
            return {"reason": "write", "step": step, "message": write_error()}
        if signum:
            return {"reason": "signal", "signal": signum, "step": step}
        before(step)
        try:
            with events.span(f"step {step}", cat="step", step=step):
                rec = trainer.step(step)
        except NonFinite as e:       # every rank raised it at the same step
            return {"reason": "nonfinite", "step": e.step, "message": str(e)}
        if ended := after(step, rec):     # a checkpoint that could not be written
            return ended
    if trainer.cfg.log_json and agreed_stop(trainer.grid, write_error() is not None)[1]:
        return {"reason": "write", "step": 0 if step is None else step + 1,    # after the last
                "message": write_error()}
    if rec and rec.get("skipped") and not trainer.weights_finite():     # the same on every rank
        return {"reason": "nonfinite", "step": step, "message": f"step {step}: the run ended on "
                f"{trainer.skipped_in_row} skipped step(s) (--skip-nonfinite) and its weights are "
                "not finite: nothing saved or exported"}
    return None


def train_on_rank(cfg: TrainConfig, report: bool = False, after_backward=None,
                  step_dir: str | None = None) -> dict:
    """What every rank runs: the loop, with what `RankRun` does around it (resume from
    `step_dir`, log, checkpoints, the teaching failure, export, the trace). Returns the
    rank's result."""
    weights = functools.partial(hf.load_weights, cfg.init_hf) if cfg.init_hf else None
    trainer = Trainer(cfg, weights, hf.tokenizer_file(cfg.init_hf), after_backward)
    around = RankRun(trainer, report, step_dir)
    return around.finish(train_steps(trainer, around.steps, around.before, around.after,
                                     lambda: around.write_error))
