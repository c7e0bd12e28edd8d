"""Run one function on N ranks: forked local processes over gloo, or an existing torchrun world.

Chapter "From a laptop to a cluster".

Locally, workers are *forked* from a parent that has already imported torch: 8 ranks start
in about a second, where spawning fresh interpreters costs 25-40 s on two cores (each
re-imports torch). That is what lets a notebook cell run real multi-process training.

A rank that dies ends the whole job with an error that names it; a rank stuck in a collective
whose peer is gone fails within the collective timeout, and the error names the rank that
never arrived, not the bystander that noticed: one whose heartbeat stopped (a stopped rank
is named on stderr as soon as its beat stops, before the timeout), or one still running and
beating that never joined the collective its peers timed out in. Nothing hangs silently.

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
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from .heartbeat import Heartbeat


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


# ---------------------------------------------------------------- heartbeats of local ranks
BEAT_S = 0.5          # a rank's heartbeat period
SILENT_S = 4.0        # no beat for this long: the rank stopped responding (loaded 2-core margin)


def _beat(beats, rank: int):
    # A rank blocked in a collective keeps beating (the wait releases the GIL); a rank
    # that is stopped (SIGSTOP, a debugger) or wedged holding the GIL does not.
    while True:
        beats[rank] = time.time()
        time.sleep(BEAT_S)


def _process_state(pid: int) -> str:
    """Linux's one-letter state of a process: R running, S sleeping, T stopped..."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


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


def _init(rank, world_size, backend, timeout_s, init_method):
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _worker(rank, world_size, backend, timeout_s, port, fn, args, kwargs, results, beats):
    handle_stop_signals()      # the parent's handlers came with the fork: replace them
    # A forked child inherits the parent's OpenMP state; with more than one thread it can
    # hang on it. Two cores shared by N ranks want one thread each anyway.
    torch.set_num_threads(1)
    threading.Thread(target=_beat, args=(beats, rank), daemon=True).start()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        _init(rank, world_size, backend, timeout_s, f"tcp://127.0.0.1:{port}")
        # plain pickle: a tensor sent through the queue as-is would be shared memory that
        # vanishes when this process exits, before the parent reads it
        results.put((rank, "ok", pickle.dumps(fn(*args, **kwargs))))
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        results.close()
        results.join_thread()   # flush the report before the hard exit
        os._exit(1)
    try:
        dist.destroy_process_group()
    except Exception:
        pass


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
    results = ctx.Queue()
    beats = ctx.Array("d", [time.time()] * world_size, lock=False)
    port = free_port()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(r, world_size, backend, timeout_s, port, fn, args, kwargs,
                               results, beats))
             for r in range(world_size)]
    with _Signals(procs, stop_grace_s) as signals:
        for p in procs:
            p.start()
        return _collect(procs, results, world_size, beats, signals, timeout_s)


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


def _collect(procs, results, world_size, beats, signals, timeout_s: float = 60.0,
             grace_s: float = 2.0):
    """Wait for every rank's result. On the first failure, keep listening for `grace_s`:
    when one rank dies, its peers fail too ("connection closed"), often before the dead
    rank's exit is noticed, and the error must name the cause, not a bystander. A rank that
    is alive but silent (no heartbeat) when the others give up is the one that hung."""
    done: dict[int, object] = {}
    errors: dict[int, str] = {}
    deadline = None
    hung: dict[int, str] = {}
    warned: set[int] = set()
    try:
        while len(done) < world_size and (deadline is None or time.monotonic() < deadline):
            if signals.expired():
                raise Stopped(signals.signum)
            _warn_stopped(procs, beats, done, warned, timeout_s)
            if deadline is None and _hung_for(procs, beats, done, timeout_s):
                break     # silent for a whole collective timeout: gloo may never say so
            try:
                rank, status, payload = results.get(timeout=0.05)
                if status == "ok":
                    done[rank] = pickle.loads(payload)
                else:
                    errors[rank] = payload
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(procs)
                    if p.exitcode not in (None, 0) and r not in errors and r not in done]
            if dead and _pending(results):
                continue      # its report may still be in the queue
            for r in dead:
                errors[r] = f"died (exit code {procs[r].exitcode}) without an error report"
            if errors and deadline is None:
                deadline = time.monotonic() + grace_s
        hung = _silent_ranks(procs, beats, done, errors, min(SILENT_S, timeout_s))
        if not hung and errors and all(_timed_out(m) for m in errors.values()):
            hung = _absent_ranks(procs, done, errors)
    finally:
        for p in procs:
            if p.is_alive() and len(done) < world_size:
                p.kill()
        for p in procs:
            p.join(timeout=10)
    if errors or hung:
        raise _failure(errors, hung)
    return [done[r] for r in range(world_size)]


def _warn_stopped(procs, beats, done, warned: set, timeout_s: float) -> None:
    """Name a stopped rank on stderr as soon as its heartbeat says so (after `SILENT_S`),
    not only when its peers give up at the collective timeout: it may still be continued
    (SIGCONT, a debugger), so the job goes on until then."""
    now = time.time()
    live = [r for r, p in enumerate(procs) if r not in done and p.is_alive()]
    for r in live:
        if r in warned or now - beats[r] < SILENT_S or _process_state(procs[r].pid) != "T":
            continue
        if min(now - beats[q] for q in live) < SILENT_S:    # others beat: not a Ctrl-Z
            warned.add(r)
            print(f"minipar: rank {r} (pid {procs[r].pid}) is stopped (SIGSTOP or a debugger): "
                  f"no heartbeat for {now - beats[r]:.0f} s; the job ends at the collective "
                  f"timeout ({timeout_s:g} s) unless it continues", file=sys.stderr, flush=True)


def _timed_out(error: str) -> bool:
    """A rank's error says it waited for a peer until the collective timeout."""
    return "timed out" in error.lower() or "timeout" in error.lower()


def _absent_ranks(procs, done, errors) -> dict[int, str]:
    """Every rank that reported timed out waiting, and these are still running, beating,
    without a result or an error: they never joined the collective the others waited in
    (stuck in Python, a sleep, a loop that releases the GIL)."""
    return {r: f"pid {p.pid}, running and beating but never joined the collective its "
               "peers timed out in"
            for r, p in enumerate(procs) if r not in done and r not in errors and p.is_alive()}


def _hung_for(procs, beats, done, timeout_s: float) -> bool:
    """Some rank is stopped (SIGSTOP, a debugger) and has not beaten for `timeout_s` while
    another still beats (so not the whole job suspended, Ctrl-Z). Only a stopped process:
    a busy machine can delay a running rank's beat for seconds (a long op holding the GIL)."""
    now = time.time()
    live = [r for r, p in enumerate(procs) if r not in done and p.is_alive()]
    stopped = [r for r in live if now - beats[r] > timeout_s and _process_state(procs[r].pid) == "T"]
    return bool(stopped) and min(now - beats[r] for r in live) < SILENT_S


def _silent_ranks(procs, beats, done, errors, silent_s: float = SILENT_S) -> dict[int, str]:
    """{rank: why} for each rank still alive, without a result or an error, whose
    heartbeat stopped: the rank its peers were waiting for."""
    now, out = time.time(), {}
    for r, p in enumerate(procs):
        if r in done or r in errors or not p.is_alive():
            continue
        state, silent = _process_state(p.pid), now - beats[r]
        if state == "T" or silent > silent_s:
            what = "stopped (SIGSTOP or a debugger)" if state == "T" else "not responding"
            out[r] = f"pid {p.pid}, {what}: no heartbeat for {silent:.0f} s"
    return out


def _pending(q) -> bool:
    # a rank may have put its report and exited before we read the queue
    try:
        return not q.empty()
    except (OSError, ValueError):
        return False


def _failure(errors: dict[int, str], hung: dict[int, str] | None = None) -> RankFailed:
    """The root cause first: a rank that died silently, else one that hung (alive, no
    heartbeat), else one whose error is not a lost connection to a peer, else the lowest."""
    def lost_peer(msg):
        return any(k in msg for k in ("Connection closed", "Connection reset", "connection",
                                      "Broken pipe", "Read error", "Timed out"))
    silent = [r for r, m in errors.items() if m.startswith("died")]
    if hung and not silent:
        return _hang(errors, hung)
    own = [r for r, m in errors.items() if not lost_peer(m)]
    cause = min(silent or own or errors)
    verb = "" if errors[cause].startswith("died") else "failed: "
    others = sorted(set(errors) - {cause})
    tail = f"\n(then ranks {others} failed as a consequence)" if others else ""
    return RankFailed(cause, f"rank {cause} {verb}{errors[cause]}{tail}", raised=bool(verb))


def _hang(errors: dict[int, str], hung: dict[int, str]) -> RankFailed:
    """The rank nobody heard from is the cause; the ranks that timed out waiting for it
    are bystanders, and the first of their errors follows on the next line."""
    cause = min(hung)
    others = sorted(set(hung) - {cause})
    also = f"; so did ranks {others}" if others else ""
    if not errors:        # the launcher noticed first: its peers are still waiting
        return RankFailed(cause, f"rank {cause} hung ({hung[cause]}){also}; the other ranks "
                                 "were left waiting for it")
    first = errors[min(errors)].splitlines()[0]
    return RankFailed(cause, f"rank {cause} hung ({hung[cause]}){also}; ranks {sorted(errors)} "
                             f"gave up waiting for it\nrank {min(errors)} reported: {first}")


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
        _init(int(os.environ["RANK"]), ws, backend or default_backend(), timeout_s, "env://")
    beat = Heartbeat(dist.get_rank(), ws, collective_timeout_s=timeout_s)  # names lost ranks
    try:
        return [fn(*args, **kwargs)]
    except Exception as e:
        raise RankFailed(dist.get_rank(), beat.explain(e), raised=True) from e
    finally:
        beat.stop()
        dist.destroy_process_group()
