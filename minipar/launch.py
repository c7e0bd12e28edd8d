"""Run one function on N ranks: forked local processes over gloo, or an existing torchrun world.

Chapter "From a laptop to a cluster".

Locally, workers are *forked* from a parent that has already imported torch: 8 ranks start
in about a second, where spawning fresh interpreters costs 25-40 s on two cores (each
re-imports torch). That is what lets a notebook cell run real multi-process training.

A rank that dies ends the whole job with an error that names it; a rank stuck in a collective
whose peer is gone fails within the collective timeout. Nothing hangs silently.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback

import torch
import torch.distributed as dist


class RankFailed(RuntimeError):
    """A rank raised or died; `.rank` is the first rank that failed."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


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


def _worker(rank, world_size, backend, timeout_s, port, fn, args, kwargs, results):
    # A forked child inherits the parent's OpenMP state; with more than one thread it can
    # hang on it. Two cores shared by N ranks want one thread each anyway.
    torch.set_num_threads(1)
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
              start_method: str | None = None, **kwargs) -> list:
    """Run `fn(*args, **kwargs)` on `world_size` fresh local ranks; return results by rank.

    Raises `RankFailed` naming the first rank that raised or exited, after stopping the
    others.
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
    port = free_port()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(r, world_size, backend, timeout_s, port, fn, args, kwargs, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    return _collect(procs, results, world_size)


def _collect(procs, results, world_size, grace_s: float = 2.0):
    """Wait for every rank's result. On the first failure, keep listening for `grace_s`:
    when one rank dies, its peers fail too ("connection closed"), often before the dead
    rank's exit is noticed, and the error must name the cause, not a bystander."""
    done: dict[int, object] = {}
    errors: dict[int, str] = {}
    deadline = None
    try:
        while len(done) < world_size and (deadline is None or time.monotonic() < deadline):
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
    finally:
        for p in procs:
            if p.is_alive() and len(done) < world_size:
                p.kill()
        for p in procs:
            p.join(timeout=10)
    if errors:
        raise _failure(errors)
    return [done[r] for r in range(world_size)]


def _pending(q) -> bool:
    # a rank may have put its report and exited before we read the queue
    try:
        return not q.empty()
    except (OSError, ValueError):
        return False


def _failure(errors: dict[int, str]) -> RankFailed:
    """The root cause first: a rank that died silently, else one whose error is not a lost
    connection to a peer, else the lowest rank."""
    def lost_peer(msg):
        return any(k in msg for k in ("Connection closed", "Connection reset", "connection",
                                      "Broken pipe", "Read error", "Timed out"))
    silent = [r for r, m in errors.items() if m.startswith("died")]
    own = [r for r, m in errors.items() if not lost_peer(m)]
    cause = min(silent or own or errors)
    verb = "" if errors[cause].startswith("died") else "failed: "
    others = sorted(set(errors) - {cause})
    tail = f"\n(then ranks {others} failed as a consequence)" if others else ""
    return RankFailed(cause, f"rank {cause} {verb}{errors[cause]}{tail}")


def run(fn, world_size: int, *args, backend: str | None = None, timeout_s: float = 60.0,
        **kwargs) -> list:
    """Run `fn` on `world_size` ranks, wherever we are.

    Inside torchrun this process is already one rank of the world: join it and return a list
    holding only this rank's result. Otherwise fork `world_size` local ranks.
    """
    if not in_torchrun():
        return run_local(fn, world_size, *args, backend=backend, timeout_s=timeout_s, **kwargs)
    ws = int(os.environ["WORLD_SIZE"])
    if ws != world_size:
        raise RuntimeError(f"torchrun started {ws} processes but the layout needs {world_size}")
    if not dist.is_initialized():
        _init(int(os.environ["RANK"]), ws, backend or default_backend(), timeout_s, "env://")
    try:
        return [fn(*args, **kwargs)]
    finally:
        dist.destroy_process_group()
