"""`python -m minipar.torchrun`: torchrun, ending on a signal the way `minipar.train` does.

Chapter "From a laptop to a cluster". It takes torchrun's flags and runs torchrun's own
agent (`torch.distributed.run.main`); only the end differs. When the agent gets SIGTERM
(Slurm's preemption, `scancel`, `timeout`) or SIGINT, torch's handler raises
`SignalException` in it; the agent passes the signal on to its workers, waits for them
(its `--shutdown-timeout`) and then lets the exception out, a 30-line traceback with exit
status 1. Here the command ends instead with one line and exit 128 + the signal (143,
130): rank 0's line when its node's workers stopped at a step boundary (with --save,
after a checkpoint), else a line saying that this node's workers were stopped. A worker
that fails ends it with one line naming the first rank that failed and its exit code
(the error that rank printed is above it; a rank SIGKILLed, most often by the OOM killer,
is said to be one).

Three more things a cluster needs. The agent handles SIGUSR1 too (Slurm's `--signal=USR1@T`,
"your time is up in T seconds"), as minipar's own launcher does. A worker has asked the
kernel to kill it when the agent dies (`launch.die_with_parent`), so that an agent killed
with SIGKILL leaves no worker training on. And a `--master-port` already in use is one
line and exit 2 before anything starts, not torchrun's EADDRINUSE traceback.

    python -m minipar.torchrun --standalone --nproc-per-node 4 -m minipar.train --dp 4
"""

import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import tempfile

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from .launch import STOP_SIGNALS, death
from .run import END_LINE_ENV

PROG = "python -m minipar.torchrun"
HELP = (f"{PROG}: torchrun (its flags below) whose agent, on SIGTERM, SIGHUP, SIGUSR1 or "
        "Ctrl-C, lets its workers stop at a step boundary (with --save, after a checkpoint) "
        "and then ends with one line and exit 128+signal (143, 130), not a traceback. A busy "
        "--master-port is one line, exit 2. For example:\n  "
        f"{PROG} --standalone --nproc-per-node 4 -m minipar.train --dp 4\n")
STOP_STATUSES = {128 + s for s in STOP_SIGNALS}
# the signals the agent passes on to its workers: torch's default list, and SIGUSR1. Its
# flag --signals-to-handle reads its default from this variable (and wins if given)
SIGNALS_ENV = "PET_SIGNALS_TO_HANDLE"
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# the agent's own lines about a signal: the one line printed here replaces them
AGENT_LOGGERS = ("torch.distributed.elastic.agent.server.api",
                 "torch.distributed.elastic.multiprocessing.api")


class _NoSignalChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("death signal" in text or "closing signal" in text)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun's agent with `argv` (torchrun's flags, then the workers' command);
    return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(HELP, file=sys.stderr)
    taken = master_port_taken(argv)
    if taken:
        print(f"{PROG}: error: {taken}", file=sys.stderr)
        return 2
    quiet = _NoSignalChatter()
    for name in AGENT_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    with tempfile.TemporaryDirectory(prefix="minipar-torchrun-") as tmp:
        line_file = os.path.join(tmp, "end_line")
        os.environ[END_LINE_ENV] = line_file      # the workers inherit it
        ours = SIGNALS_ENV not in os.environ       # else the user's own list holds
        os.environ.setdefault(SIGNALS_ENV, AGENT_SIGNALS)
        try:
            torch_run.main(argv)
            return 0
        except SignalException as e:
            return stopped(int(e.sigval), line_file)
        except ChildFailedError as e:
            return child_failed(e, line_file)
        finally:
            os.environ.pop(END_LINE_ENV, None)
            if ours:
                os.environ.pop(SIGNALS_ENV, None)
            for name in AGENT_LOGGERS:
                logging.getLogger(name).removeFilter(quiet)


def stopped(signum: int, line_file: str) -> int:
    """The agent got `signum` and has passed it on to its workers: one line, 128 + it."""
    with _ignoring_stop_signals():
        left = kill_children()      # a second signal can cut the agent's shutdown short
        line = _read(line_file) or (
            f"{PROG}: stopped by {signal.Signals(signum).name}; this node's workers were "
            "stopped (no step boundary reported here: rank 0 runs on another node, or the "
            "workers were stopped before they reached one)")
        if left:
            line += f" (killed {len(left)} worker(s) still running: pids {left})"
        print(line, file=sys.stderr, flush=True)
    return 128 + signum


def child_failed(e: ChildFailedError, line_file: str) -> int:
    """A worker exited non-zero. Workers that all exited 143/130 stopped on a signal they
    got themselves (Slurm signals every process of a step): report it like one to the agent."""
    codes = {f.exitcode for f in e.failures.values()}
    if codes <= STOP_STATUSES and len(codes) == 1:
        return stopped(codes.pop() - 128, line_file)
    rank, failure = e.get_first_failure()
    how = (death(failure.exitcode) if failure.exitcode == -signal.SIGKILL else
           f"exited with {failure.exitcode} first; what it printed above says why")
    print(f"{PROG}: error: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) "
          f"{how}", file=sys.stderr)
    return 1


def master_port_taken(argv: list[str]) -> str | None:
    """Why `--master-port P` cannot be used, when this agent would host the job's store on
    it (the static rendezvous: no --standalone, no --rdzv-endpoint, node rank 0) and P is
    taken; None when it is free (or the flag does not apply). Proved by binding P, as the
    store will: once, now, before any worker starts."""
    args = torch_run.parse_args(argv)
    if args.master_port is None or args.standalone or args.rdzv_backend != "static" \
            or args.rdzv_endpoint or args.node_rank != 0:
        return None
    try:
        socket.create_server(("", args.master_port)).close()
    except OSError as e:
        what = "is in use" if e.errno == errno.EADDRINUSE else "cannot be listened on"
        return (f"--master-port {args.master_port} {what} ({os.strerror(e.errno)}): pick a free "
                "port, or leave the flag out (with --standalone torchrun picks one)")
    return None


@contextlib.contextmanager
def _ignoring_stop_signals():
    old = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def kill_children() -> list[int]:
    """SIGKILL every child of this process still alive (read from /proc); their PIDs."""
    me, out = os.getpid(), []
    pids = [e for e in os.listdir("/proc") if e.isdigit()] if os.path.isdir("/proc") else []
    for entry in pids:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == me and fields[0] != "Z":
                os.kill(int(entry), signal.SIGKILL)
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass          # not a process, or gone meanwhile
    return sorted(out)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""
