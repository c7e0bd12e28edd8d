"""Run one function on N ranks: forked local processes over gloo, or an existing torchrun world.

Chapter "Failures at scale".

Locally, workers are *forked* from a parent that has already imported torch: 8 ranks start
in about a second, where spawning fresh interpreters costs 25-40 s on two cores (each
re-imports torch). That is what lets a notebook cell run real multi-process training. The
ranks beat into memory they share with the launcher, which watches them (`heartbeat.py`).

A rank that dies ends the whole job with an error that names it, not the bystanders whose
collectives failed after it. A rank that hangs (stopped, or stuck outside the collective
its peers wait in) is named by its heartbeat: on stderr as soon as a stopped rank's beat
stops, and in the error when its peers give up at the collective timeout. Nothing hangs
silently. Which rank is the cause is read from structure, never from an error's text: the
exit codes (a rank that died without a report), the heartbeats (a rank that stopped
beating, or beats but never came), and the order of the reports (a rank reports before it
exits, and its peers fail only after it has exited, so the cause reports first).

Signals. SIGTERM (what Slurm, Kubernetes and `timeout` send) and SIGINT (Ctrl-C) to the
launcher are passed on to every rank. A rank only raises a flag; at the next step boundary
all ranks agree on it with one all-reduce (`stop_requested`, reduced by the training loop),
so they stop at the *same* step, and a run with --save checkpoints there first. Ranks that
have not stopped within the grace period (or at a second signal) are killed. Nothing is left
behind either way. Under torchrun the agent passes the signals on; `python -m
minipar.torchrun` is torchrun whose agent then ends with the same one line.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback

import torch
import torch.distributed as dist

from .heartbeat import Heartbeat, LauncherWatch, SharedBoard, StoreHeartbeat, timed_out


class RankFailed(RuntimeError):
    """A rank raised or died; `.rank` is the first rank that failed, `.raised` whether it
    did so by an exception (not by dying or hanging)."""

    def __init__(self, rank: int, message: str, raised: bool = False):
        super().__init__(message)
        self.rank, self.raised = rank, raised


class Stopped(RuntimeError):
    """A signal stopped the job before its ranks could agree on a step to stop at (or
    before any rank started); `.signum` is the signal."""

    def __init__(self, signum: int, message: str = ""):
        name = signal.Signals(signum).name
        super().__init__(message or f"stopped by {name} before the ranks reached a step boundary")
        self.signum = signum


# ---------------------------------------------------------------- signals, in a rank
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_stop_signal = 0      # the signal this rank was asked to stop by (0: none)


def stop_requested() -> int:
    """The signal that asked this rank to stop, or 0. The loop all-reduces it (MAX) at each
    step boundary: a signal that reaches one rank stops all of them at the same step."""
    return _stop_signal


def _note_stop(signum, frame):
    global _stop_signal
    _stop_signal = _stop_signal or signum


def handle_stop_signals() -> None:
    """In a rank: SIGTERM and SIGINT raise the flag instead of killing the process (no
    KeyboardInterrupt traceback from inside a collective)."""
    global _stop_signal
    _stop_signal = 0
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, _note_stop)


# ---------------------------------------------------------------- where we run
def in_torchrun() -> bool:
    """True when torchrun (or Slurm via torchrun) has already made this process a rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def device() -> torch.device:
    """This rank's device: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def free_port() -> int:
    """A port the OS says is free now, so that concurrent runs do not collide."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank, world_size, backend, timeout_s, init_method="env://"):
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


# ---------------------------------------------------------------- local ranks
def run_local(fn, world_size: int, *args, backend: str | None = None, timeout_s: float = 60.0,
              start_method: str | None = None, stop_grace_s: float = 30.0, **kwargs) -> list:
    """Run `fn(*args, **kwargs)` on `world_size` fresh local ranks; return results by rank.

    Raises `RankFailed` naming the first rank that raised, exited or hung, after stopping
    the others; `Stopped` when a signal ended the job and the ranks did not return within
    `stop_grace_s` (ranks that stop at a step boundary return normally).
    """
    backend = backend or default_backend()
    # CUDA cannot be used in a forked child once the parent touched it: spawn for NCCL.
    method = start_method or ("spawn" if backend == "nccl" else "fork")
    ctx = mp.get_context(method)
    if method == "fork":
        # torch.optim's constructors import torch._dynamo lazily: seconds per process. Done
        # once here, every forked rank inherits it instead of importing it on its own.
        import torch._dynamo  # noqa: F401
    results, board, port = ctx.Queue(), SharedBoard(ctx, world_size), free_port()
    procs = [ctx.Process(target=_worker, daemon=True, args=(
        r, world_size, backend, timeout_s, port, fn, args, kwargs, results, board))
        for r in range(world_size)]
    watch = None
    with _Signals(procs, stop_grace_s) as signals:
        try:
            for p in procs:
                p.start()
            watch = LauncherWatch(procs, board, timeout_s)
            return _collect(procs, results, watch, signals)
        finally:
            if watch:
                watch.stop()
            for p in procs:          # no rank outlives its launcher
                if p.is_alive():
                    p.kill()
                p.join(timeout=10)


def _worker(rank, world_size, backend, timeout_s, port, fn, args, kwargs, results, board):
    handle_stop_signals()      # the parent's handlers came with the fork: replace them
    # A forked child inherits the parent's OpenMP state; with more than one thread it can
    # hang on it. Two cores shared by N ranks want one thread each anyway.
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    Heartbeat(rank, board)     # beats until this process ends; the launcher watches
    try:
        _init(rank, world_size, backend, timeout_s, f"tcp://127.0.0.1:{port}")
        # plain pickle: a tensor sent through the queue as-is would be shared memory that
        # vanishes when this process exits, before the parent reads it
        results.put((rank, "ok", pickle.dumps(fn(*args, **kwargs))))
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        results.put((rank, "timed out" if timed_out(e) else "error",
                     f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        results.close()
        results.join_thread()   # flush the report before the hard exit
        os._exit(1)
    dist.destroy_process_group()


class _Signals:
    """In the launcher, while ranks run: SIGTERM / SIGINT are passed on to every rank and
    start the grace period; a second signal, or the end of the grace period, kills them.
    SIGINT gets a short grace (Ctrl-C wants the prompt back); SIGTERM `stop_grace_s` (the
    ranks may be writing a checkpoint)."""

    def __init__(self, procs, stop_grace_s: float):
        self.procs, self.grace = procs, stop_grace_s
        self.signum, self.deadline, self.old = 0, None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self.old.items():
            signal.signal(s, handler)

    def _on_signal(self, signum, frame):
        if self.signum:                      # the second one: no more waiting
            self.deadline = time.monotonic()
            return
        self.signum = signum
        grace = min(self.grace, 5.0) if signum == signal.SIGINT else self.grace
        self.deadline = time.monotonic() + grace
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                try:
                    os.kill(p.pid, signum)
                except ProcessLookupError:
                    pass

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _collect(procs, results, watch: LauncherWatch, signals: _Signals, grace_s: float = 2.0):
    """Wait for every rank's result. On the first failure keep listening for `grace_s`: when
    one rank dies its peers fail too ("connection closed"), often before its exit is
    noticed, and the error must name the cause, not a bystander."""
    done, errors, waited = {}, {}, set()          # errors in the order they came
    deadline = None
    while len(done) < len(procs) and (deadline is None or time.monotonic() < deadline):
        if signals.expired():
            raise Stopped(signals.signum)
        if deadline is None and watch.hung is not None:
            break     # silent for a whole collective timeout: gloo may never say so
        _receive(results, done, errors, waited, timeout=0.05)
        if deadline is None and (errors or any(p.exitcode for p in procs)):
            deadline = time.monotonic() + grace_s
    while _receive(results, done, errors, waited, timeout=0):
        pass          # a rank that exited may have reported just before
    died = {r: p.exitcode for r, p in enumerate(procs)
            if p.exitcode and r not in errors and r not in done}
    waiting = [r for r, p in enumerate(procs) if p.is_alive() and r not in done and r not in errors]
    hung = watch.culprits(waiting, waited=bool(errors) and next(iter(errors)) in waited)
    if errors or died or hung:
        raise _failure(errors, died, hung)
    return [pickle.loads(done[r]) for r in range(len(procs))]


def _receive(results, done: dict, errors: dict, waited: set, timeout: float) -> bool:
    """Take one report off the queue, if one comes within `timeout` seconds."""
    try:
        rank, status, payload = results.get(timeout=timeout)
    except (queue.Empty, OSError, ValueError):
        return False
    (done if status == "ok" else errors)[rank] = payload
    waited.update([rank] if status == "timed out" else [])
    return True


def _failure(errors: dict[int, str], died: dict[int, int], hung: dict[int, str]) -> RankFailed:
    """The root cause first: a rank that died without a report, else the ranks the others
    waited for (`hung`), else the first rank that reported. The bystanders follow."""
    if died or not hung:
        cause = min(died) if died else next(iter(errors))
        what = (f"died (exit code {died[cause]}) without an error report" if died
                else f"failed: {errors[cause]}")
        others = sorted((set(errors) | set(died)) - {cause})
        tail = f"\n(then ranks {others} failed as a consequence)" if others else ""
        return RankFailed(cause, f"rank {cause} {what}{tail}", raised=not died)
    cause = min(hung)
    also = f"; so did ranks {sorted(set(hung) - {cause})}" if len(hung) > 1 else ""
    if not errors:        # the launcher noticed first: its peers are still waiting
        return RankFailed(cause, f"rank {cause} hung ({hung[cause]}){also}; the other ranks "
                                 "were left waiting for it")
    first = next(iter(errors))
    return RankFailed(cause, f"rank {cause} hung ({hung[cause]}){also}; ranks {sorted(errors)} "
                             f"gave up waiting for it\nrank {first} reported: "
                             + errors[first].splitlines()[0])


# ---------------------------------------------------------------- a torchrun world
def run(fn, world_size: int, *args, backend: str | None = None, timeout_s: float = 60.0,
        stop_grace_s: float = 30.0, **kwargs) -> list:
    """Run `fn` on `world_size` ranks, wherever we are.

    Inside torchrun this process is already one rank of the world: join it and return a list
    holding only this rank's result. Otherwise fork `world_size` local ranks.
    """
    if not in_torchrun():
        return run_local(fn, world_size, *args, backend=backend, timeout_s=timeout_s,
                         stop_grace_s=stop_grace_s, **kwargs)
    handle_stop_signals()     # torchrun's agent passes SIGTERM/SIGINT on to its workers
    ws = int(os.environ["WORLD_SIZE"])
    if ws != world_size:
        raise RuntimeError(f"torchrun started {ws} processes but the layout needs {world_size}")
    if not dist.is_initialized():
        _init(int(os.environ["RANK"]), ws, backend or default_backend(), timeout_s)
    beat = StoreHeartbeat(dist.get_rank(), ws, collective_timeout_s=timeout_s)  # names lost ranks
    try:
        return [fn(*args, **kwargs)]
    except Exception as e:
        raise RankFailed(dist.get_rank(), beat.explain(e), raised=True) from e
    finally:
        beat.stop()
        dist.destroy_process_group()
