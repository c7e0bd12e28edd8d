"""The command line of `python -m minipar.train`: flags generated from the config dataclasses.

Chapter "From a laptop to a cluster". Every flag is a field of `ParallelConfig` or
`TrainConfig` (`config.opt`): its name, type, default and help are written once, there.
A bad flag is one line on stderr naming it, and exit status 2, before any rank starts.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

from . import launch
from .config import ParallelConfig, TrainConfig, add_flags, from_flags
from .launch import STOP_SIGNALS, Stopped

PROG = "python -m minipar.train"


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # one line naming the flag, exit 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                description="Train a Llama-style model on tp*cp*pp*dp ranks: local gloo "
                            "processes, or the torchrun world.",
                epilog="Signals: SIGTERM or Ctrl-C stops every rank at the next step boundary "
                       "(with --save, after a checkpoint there; a second Ctrl-C stops at once), "
                       "one line, exit 128+signal (143, 130). Under torchrun, start the agent "
                       "as `python -m minipar.torchrun` (torchrun's flags) for the same.")
    add_flags(p.add_argument_group("layout (ParallelConfig)"), ParallelConfig)
    add_flags(p.add_argument_group("run (TrainConfig)"), TrainConfig)
    return p


def parse(argv=None) -> TrainConfig:
    """The run the flags describe (exits 2 on a malformed flag)."""
    ns = build_parser().parse_args(argv)
    return from_flags(TrainConfig, ns, parallel=from_flags(ParallelConfig, ns))


def error(e: Exception, status: int = 2, detail: bool = False, prefix: str = "error: ") -> int:
    """Print `e`'s first line as the CLI's error (and, with `detail`, the rest); return
    the exit status."""
    first, *rest = str(e).splitlines() or [""]
    print(f"{PROG}: {prefix}{first}", file=sys.stderr)
    if detail and rest:
        print("\n".join(rest), file=sys.stderr)
    return status


@contextlib.contextmanager
def stop_on_signals():
    """While no rank runs (checks, restarts), SIGTERM and SIGINT end the command at once
    with `launch.Stopped`: one line, not a KeyboardInterrupt traceback. While ranks run,
    the launcher's own handlers take over (they pass the signal on to the ranks)."""
    def stop(signum, frame):
        raise Stopped(signum, f"stopped by {signal.Signals(signum).name} before any rank started")
    old = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def report_end(ended: dict, rank0: bool = True) -> int:
    """The one line of a run that ended early, on stderr; its exit status: 128 + signal
    for a stop (143 SIGTERM, 130 SIGINT), 1 for a non-finite step."""
    if ended["reason"] == "nonfinite":
        if rank0:
            print(f"{PROG}: error: {ended['message']}", file=sys.stderr)
        return 1
    name = signal.Signals(ended["signal"]).name
    if ended["checkpoint"]:
        saved = f"checkpoint saved to {ended['checkpoint']} (continue with --resume)"
    else:
        saved = "no checkpoint (with --save, SIGTERM or Ctrl-C writes one)"
    if rank0:
        say(f"{PROG}: stopped by {name} after {ended['step']} steps, every rank at the same "
            f"step boundary; {saved}")
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


def print_summary(out: dict) -> None:
    """The last step's loss, gradient norm and throughput (rank 0 only has records)."""
    recs = out["records"]
    if not recs:
        return
    last = recs[-1]
    restarts = f"  (after {len(out['failures'])} restart(s))" if out.get("failures") else ""
    print(f"step {last['step']}: loss {last['loss']:.6f}  grad_norm {last['grad_norm']:.4f}  "
          f"{last['tokens_per_s']:.0f} tokens/s" + restarts)
