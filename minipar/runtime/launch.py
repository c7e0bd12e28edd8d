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

Signals. SIGTERM (what Slurm, Kubernetes and `timeout` send), SIGINT (Ctrl-C), SIGHUP (the
terminal or ssh session is gone) and SIGUSR1 (Slurm's `--signal=USR1@T`: "your time is up
in T seconds") to the launcher are passed on to every rank. A rank only raises a flag; at
the next step boundary all ranks agree on it with one all-reduce (`stop_requested`,
reduced by the training loop), so they stop at the *same* step, and a run with --save
checkpoints there first. Ranks that have not stopped within the grace period (or at a
second signal) are killed. Nothing is left behind either way, even when the launcher itself
is killed (SIGKILL runs none of its code): each rank has asked the kernel to kill it when
its parent dies (`die_with_parent`). Under torchrun the agent passes the signals on;
`python -m minipar.torchrun` is torchrun whose agent then ends with the same one line.
"""
import contextlib
import ctypes
import datetime
import math
import multiprocessing as mp
import os
import pathlib
import pickle
import queue
import signal
import socket
import threading
import time
import traceback

import torch
import torch.distributed as dist

from .heartbeat import Heartbeat, LauncherWatch, StoreHeartbeat, timed_out


class RankFailed(RuntimeError):
    """A rank raised or died; `.rank` is the first rank that failed, `.raised` whether it
    did so by an exception (not by dying or hanging), `.exitcode` how it died (-N: killed
    by signal N; None: it raised or hung)."""

    def __init__(self, rank: int, message: str, raised: bool = False, exitcode: int | None = None):
        super().__init__(message)
        self.rank, self.raised, self.exitcode = rank, raised, exitcode


class Stopped(RuntimeError):
    """A signal stopped the job before its ranks could agree on a step to stop at (or,
    `when` says, before any rank started); `.signum` is the signal."""

    def __init__(self, signum: int, when: str = "before the ranks reached a step boundary"):
        super().__init__(f"stopped by {signal.Signals(signum).name} {when}")
        self.signum = signum


# ---------------------------------------------------------------- signals
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
_signals: list[int] = []      # the stop signals this process got, in the order they came


def stop_requested() -> int:
    """The signal that asked this rank to stop, or 0. The loop all-reduces it (MAX) at each
    step boundary: a signal that reaches one rank stops all of them at the same step."""
    return _signals[0] if _signals else 0


def handle_stop_signals() -> dict:
    """The STOP_SIGNALS are noted instead of killing the process: in a rank they raise the
    flag (no KeyboardInterrupt traceback from inside a collective); in the launcher
    `_collect` passes them on to the ranks. Returns the handlers they replace."""
    _signals.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}        # only the main thread may set handlers
    return {s: signal.signal(s, lambda signum, _: _signals.append(signum)) for s in STOP_SIGNALS}


# ---------------------------------------------------------------- where we run
def in_torchrun() -> bool:
    """True when torchrun (or Slurm via torchrun) has already made this process a rank.
    TORCHELASTIC_RUN_ID is set by torchrun's agent alone: RANK, WORLD_SIZE and MASTER_ADDR
    may be left over in a shell from some other job."""
    return {"TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR"} <= os.environ.keys()


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def free_port() -> int:
    """A port the OS says is free now, so that concurrent runs do not collide."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def die_with_parent(parent: int):
    """Have the kernel SIGKILL this rank when its launcher, `parent`, dies, however it dies:
    a launcher killed by SIGKILL (or the OOM killer) runs no code to stop its ranks, which
    would otherwise train on, orphaned, and go on writing checkpoints (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing). A parent already gone before that: exit now."""
    with contextlib.suppress(AttributeError, OSError):     # not Linux: no prctl
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)          # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _init(rank, world_size, backend, timeout_s, init_method="env://"):
    """Join the world, through `init_method` (env://: the one torchrun describes)."""
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


# ---------------------------------------------------------------- local ranks
def run_local(fn, world_size: int, *args, backend: str | None = None, timeout_s: float = 60.0,
              stop_grace_s: float = 30.0, **kwargs) -> list:
    """Run `fn(*args, **kwargs)` on `world_size` fresh local ranks; return results by rank.

    Raises `RankFailed` naming the first rank that raised, exited or hung, after stopping
    the others; `Stopped` when a signal ended the job and the ranks did not return within
    `stop_grace_s` (ranks that stop at a step boundary return normally).
    """
    backend = backend or default_backend()
    # CUDA cannot be used in a forked child once the parent touched it: spawn for NCCL.
    ctx = mp.get_context("spawn" if backend == "nccl" else "fork")
    if ctx.get_start_method() == "fork":
        # torch.optim's constructors import torch._dynamo lazily: seconds per process. Done
        # once here, every forked rank inherits it instead of importing it on its own.
        import torch._dynamo  # noqa: F401
    # the ranks' heartbeat counters: shared memory, made before the fork, that they write
    # and the launcher reads
    results, counts, port = ctx.Queue(), ctx.Array("q", world_size, lock=False), free_port()
    job = (world_size, backend, timeout_s, port, fn, args, kwargs, results, counts)
    procs = [ctx.Process(target=_worker, args=(r, *job), daemon=True) for r in range(world_size)]
    old, watch = handle_stop_signals(), None
    try:
        for p in procs:
            p.start()
        watch = LauncherWatch(procs, counts, timeout_s)
        return _collect(procs, results, watch, stop_grace_s)
    finally:
        if watch:
            watch.stop()
        for p in procs:          # no rank outlives its launcher
            if p.pid is not None:    # started (kill() passes over one that has ended)
                p.kill()
                p.join(timeout=10)
        for s, handler in old.items():
            signal.signal(s, handler)


def _worker(rank, world_size, backend, timeout_s, port, fn, args, kwargs, results, counts):
    """One forked rank: beat, join the world, run `fn`, and report to the launcher its
    result, or its error and whether that error was a wait that timed out."""
    die_with_parent(mp.parent_process().pid)
    handle_stop_signals()      # the parent's handlers came with the fork: replace them
    # A forked child inherits the parent's OpenMP state; with more than one thread it can
    # hang on it. Two cores shared by N ranks want one thread each anyway.
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    Heartbeat(rank, counts)     # beats until this process ends; the launcher watches
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
    with contextlib.suppress(Exception):     # the parent has its result: nothing to report
        dist.destroy_process_group()


def _pass_on_stop(procs, stop_grace_s: float, stop_by: float) -> float:
    """In the launcher, while ranks run: the first of the STOP_SIGNALS it got is passed on to
    every rank and starts the grace period; a second signal, or the end of the grace period,
    raises `Stopped` (the ranks are then killed). SIGINT gets a short grace (Ctrl-C wants the
    prompt back); the others `stop_grace_s` (the ranks may be writing a checkpoint). Returns
    the end of the grace period (`stop_by`, infinite until a signal came)."""
    if _signals and stop_by == math.inf:
        for p in procs:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):    # it just ended
                    os.kill(p.pid, _signals[0])
        grace = min(stop_grace_s, 5.0) if _signals[0] == signal.SIGINT else stop_grace_s
        stop_by = time.monotonic() + grace
    if len(_signals) > 1 or time.monotonic() >= stop_by:     # the second one: no more waiting
        raise Stopped(_signals[0])
    return stop_by


def _collect(procs, results, watch: LauncherWatch, stop_grace_s: float, grace_s: float = 2.0):
    """Wait for every rank's report. On the first failure (a rank that exits with an error
    code: one that reported an error exits at once) keep listening for `grace_s`: when one
    rank dies its peers fail too ("connection closed"), often before its exit is noticed,
    and the error must name the cause, not a bystander. Then the ranks that are still
    running without a report are the watch's to judge: stopped, silent, or (when the first
    error was a timeout) absent from the collective the others waited in."""
    reports = {}                       # {rank: (status, payload)}, in the order they came
    deadline = stop_by = math.inf      # the end of a failure's grace period; of a signal's
    while len(reports) < len(procs) and time.monotonic() < deadline:
        stop_by = _pass_on_stop(procs, stop_grace_s, stop_by)
        if deadline == math.inf and watch.hung is not None:
            break     # silent for a whole collective timeout: gloo may never say so
        _receive(results, reports, timeout=0.05)
        if deadline == math.inf and any(p.exitcode for p in procs):
            deadline = time.monotonic() + grace_s
    _receive(results, reports, timeout=0)     # a rank that exited may have reported just before
    errors = {r: text for r, (status, text) in reports.items() if status != "ok"}
    died = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode and r not in reports}
    waiting = [r for r, p in enumerate(procs) if p.is_alive() and r not in reports]
    first = next((status for status, _ in reports.values() if status != "ok"), None)
    hung = watch.culprits(waiting, waited=first == "timed out")
    if errors or died or hung:
        raise _failure(errors, died, hung)
    return [pickle.loads(reports[r][1]) for r in range(len(procs))]


def _receive(results, reports: dict, timeout: float):
    """Move the reports on the queue into `reports`, waiting up to `timeout` s for the first."""
    with contextlib.suppress(queue.Empty, OSError, ValueError):
        while True:
            rank, status, payload = results.get(timeout=timeout)
            reports[rank] = status, payload
            timeout = 0


def _failure(errors: dict[int, str], died: dict[int, int], hung: dict[int, str]) -> RankFailed:
    """The root cause first: a rank that died without a report, else the ranks the others
    waited for (`hung`), else the first rank that reported. The bystanders follow."""
    if died or not hung:
        cause = min(died) if died else next(iter(errors))
        what = death(died[cause]) if died else f"failed: {errors[cause]}"
        others = sorted((set(errors) | set(died)) - {cause})
        tail = f"\n(then ranks {others} failed as a consequence)" if others else ""
        return RankFailed(cause, f"rank {cause} {what}{tail}", raised=not died,
                          exitcode=died[cause] if died else None)
    cause, first = min(hung), next(iter(errors), None)
    also = f"; so did ranks {sorted(set(hung) - {cause})}" if len(hung) > 1 else ""
    tail = ((f"ranks {sorted(errors)} gave up waiting for it\nrank {first} reported: "
             + errors[first].splitlines()[0]) if errors
            else "the other ranks were left waiting for it")   # the launcher noticed first
    return RankFailed(cause, f"rank {cause} hung ({hung[cause]}){also}; {tail}")


def death(code: int) -> str:
    """How a rank that left no report ended, from its exit code (-N: killed by signal N).
    A SIGKILL that nobody in the job sent is most often the kernel's OOM killer: the count
    of OOM kills of this process's memory cgroup says whether it has been at work. A SIGBUS
    is a memory-mapped file that shrank under the rank (minipar maps --data: `run.train`
    names it)."""
    if code == -signal.SIGBUS:
        return ("was killed by SIGBUS (exit -7): a memory-mapped file it read was truncated "
                "or replaced while the run read it")
    if code != -signal.SIGKILL:
        return f"died (exit code {code}) without an error report"
    kills, limit = oom_kills() or (None, None)       # none: out of memory, or a `kill -9`
    why = ("the usual cause is the kernel's OOM killer: out of memory (`dmesg` says)"
           if kills is None else f"{'most likely out of memory: ' * bool(kills)}its memory cgroup "
           f"({limit}) has counted {kills} OOM kill(s)")
    return f"was killed (SIGKILL, exit -9) without an error report; {why}"


def oom_kills(root: str = "/sys/fs/cgroup", mine: str = "/proc/self/cgroup"):
    """(the OOM kills, the memory limit) of this process's memory cgroup, or None where no
    cgroup can be read: `oom_kill N` in v2's memory.events or v1's memory.oom_control
    counts the kills by any OOM killer, the whole machine's too."""
    with contextlib.suppress(TypeError, ValueError, KeyError):     # TypeError: nothing read
        events, most = memory_cgroup(("oom", "limit"), root, mine)
        unlimited = not most.strip().isdigit() or int(most) >= 2**60     # v2 "max", v1 ~2**63
        return (int(dict(line.split() for line in events.splitlines())["oom_kill"]),
                "no limit" if unlimited else f"limit {int(most) / 2**30:.1f} GiB")


# a memory cgroup's files, in cgroup v2 (its mount's top) and in v1 (under memory/)
CGROUP_FILES = {"": {"oom": "memory.events", "limit": "memory.max", "usage": "memory.current"},
                "memory": {"oom": "memory.oom_control", "limit": "memory.limit_in_bytes",
                           "usage": "memory.usage_in_bytes"}}


def memory_cgroup(what, root: str = "/sys/fs/cgroup", mine: str = "/proc/self/cgroup"):
    """The texts of the files `what` ("oom", "limit", "usage") of this process's memory
    cgroup, or None where none can be read. Its own cgroup first, as `mine` names it
    (`0::/path` in v2, `N:memory:/path` in v1: a Slurm job's), then the top of the mount
    `root` (a container's own cgroup)."""
    dirs = [(kind, os.path.join(root, kind)) for kind in CGROUP_FILES]
    with contextlib.suppress(OSError, ValueError), open(mine) as f:
        dirs[:0] = [(kind, os.path.join(root, kind, path.strip().lstrip("/")))
                    for _, kind, path in (line.split(":", 2) for line in f) if kind in CGROUP_FILES]
    for kind, d in dirs:
        with contextlib.suppress(OSError):
            return [pathlib.Path(d, CGROUP_FILES[kind][w]).read_text() for w in what]


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
    # torchrun's agent is our parent (one that died while we started took its store with
    # it: joining the world below fails)
    die_with_parent(os.getppid())
    handle_stop_signals()     # torchrun's agent passes the STOP_SIGNALS on to its workers
    if (ws := int(os.environ["WORLD_SIZE"])) != world_size:
        raise RuntimeError(f"torchrun started {ws} processes but the layout needs {world_size}")
    _init(int(os.environ["RANK"]), ws, backend or default_backend(), timeout_s)
    beat = StoreHeartbeat(dist.get_rank(), ws, timeout_s)      # names lost ranks
    try:
        return [fn(*args, **kwargs)]
    except Exception as e:
        raise RankFailed(dist.get_rank(), beat.explain(e), raised=True) from e
    finally:
        beat.stop()
        dist.destroy_process_group()
