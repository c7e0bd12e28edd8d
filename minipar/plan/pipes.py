"""Output to a closed pipe (`python -m minipar.costmodel.evaluate | head -1`) ends quietly, as
Unix tools do: no BrokenPipeError traceback, and the status a tool killed by SIGPIPE reports
to its shell, 141 (128 + 13), so that `set -o pipefail` still sees the output was cut short
(without pipefail a pipeline's status is its last command's, head's 0). What Python's docs
recommend (library/signal, "Note on SIGPIPE"): stdout pointed at devnull, so the
interpreter's final flush does not fail again.

Chapter "One model, sixteen thousand GPUs" (the commands): every command that prints a
report (the cost model, its evaluation, the replay, generate) ends so."""
import functools
import os
import sys

CLOSED_PIPE_EXIT = 128 + 13          # 128 + SIGPIPE, what the shell reports for `yes | head -1`


def closed_pipe_exit() -> int:
    """After a BrokenPipeError on stdout: the rest of the output to devnull; 141."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # a stdout without a descriptor (tests)
        pass
    return CLOSED_PIPE_EXIT


def quiet_on_closed_pipe(main):
    """`main` (argv -> exit status), its output flushed inside it: a closed pipe is 141."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            status = main(*args, **kwargs)
            sys.stdout.flush()
            return status
        except BrokenPipeError:
            return closed_pipe_exit()
    return wrapped
