"""Signals to the command line, and a rank that hangs: every rank stops, no process is left
behind, one line says what happened, and the exit status says which signal (128 + it).

Each test starts `python -m minipar.train` as a real process in a session of its own, waits
for its first step in the --log-json file, then signals it (or stops one rank) and checks
the children it had by PID.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from minipar.runtime import checkpoint

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (from /proc: no psutil needed)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return sorted(out)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start(tmp_path, repo_root, *flags, steps=100_000):
    """The CLI on 2 ranks, in its own session; returns it with its ranks' PIDs (rank order:
    they are forked in order) once a step has been logged."""
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "minipar.train", "--dp", "2", "--steps",
                             str(steps), "--no-progress", "--log-json", str(log), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)
    wait_for_a_step(proc, log, 180)
    ranks = children(proc.pid)
    assert len(ranks) == 2, ranks
    return proc, ranks, log


def start_torchrun(tmp_path, repo_root, *flags, agent_flags=()):
    """`python -m minipar.torchrun` with 2 workers of `minipar.train --dp 2`, in its own
    session; returns it and the log path once a step has been logged."""
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env.update(PYTHONPATH=str(repo_root), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "minipar.torchrun", "--standalone",
                             "--nproc-per-node", "2", *agent_flags, "-m", "minipar.train",
                             "--dp", "2", "--steps", "100000", "--no-progress",
                             "--log-json", str(log), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)
    wait_for_a_step(proc, log, 240)
    return proc, log


def wait_for_a_step(proc, log, seconds: float):
    """Until the run has logged a step (it must not end before)."""
    deadline = time.monotonic() + seconds
    while not (log.exists() and log.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no step within {seconds:g} s"
        time.sleep(0.2)


def finish(proc, ranks, status: int) -> str:
    """Wait for the CLI; check its status, its one line and that no rank outlived it."""
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(alive(r) for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [r for r in ranks if alive(r)]
    for r in left:
        os.kill(r, signal.SIGKILL)
    assert not left, f"ranks {left} outlived the CLI"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == status, err
    return err


def test_sigterm_checkpoints_at_a_step_boundary_and_exits_143(tmp_path, repo_root):
    save = tmp_path / "ckpt"
    proc, ranks, log = start(tmp_path, repo_root, "--save", str(save), "--save-every", "1000")
    proc.send_signal(signal.SIGTERM)             # what Slurm, Kubernetes and `timeout` send
    err = finish(proc, ranks, 128 + signal.SIGTERM)
    [line] = err.strip().splitlines()
    assert "stopped by SIGTERM after" in line and "checkpoint saved to" in line
    # nothing lost: the checkpoint holds every step the log shows, and `latest` names it
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    step_dir = checkpoint.latest(str(save))
    assert step_dir in line
    manifest = checkpoint.read_manifest(step_dir)
    assert manifest["step"] == len(rows) and [r["step"] for r in rows] == list(range(len(rows)))
    checkpoint.check_files(step_dir, manifest)


def test_ctrl_c_checkpoints_a_save_run_stops_every_rank_and_exits_130(tmp_path, repo_root):
    save = tmp_path / "ckpt"
    proc, ranks, log = start(tmp_path, repo_root, "--save", str(save), "--save-every", "1000")
    os.killpg(proc.pid, signal.SIGINT)           # a terminal's Ctrl-C: the whole group
    err = finish(proc, ranks, 128 + signal.SIGINT)
    [line] = err.strip().splitlines()
    assert "stopped by SIGINT after" in line and "checkpoint saved to" in line
    step_dir = checkpoint.latest(str(save))
    assert step_dir in line
    assert checkpoint.read_manifest(step_dir)["step"] == len(log.read_text().splitlines())


def test_the_stop_line_says_whether_a_checkpoint_was_written(capsys):
    from minipar.runtime import run
    for signum, where, said in [(signal.SIGINT, None, "no checkpoint (with --save, SIGTERM or "
                                 "Ctrl-C writes one)"), (signal.SIGTERM, "d/step_000007",
                                                        "checkpoint saved to d/step_000007")]:
        ended = {"reason": "signal", "signal": signum, "step": 7, "checkpoint": where}
        assert run.report_end(ended) == 128 + signum
        [line] = capsys.readouterr().err.splitlines()
        assert f"stopped by {signal.Signals(signum).name} after 7 steps" in line and said in line


def test_a_stopped_rank_is_named_at_once_and_again_when_its_peers_give_up(tmp_path, repo_root):
    proc, ranks, _ = start(tmp_path, repo_root, "--timeout-s", "10")
    os.kill(ranks[1], signal.SIGSTOP)            # alive, silent: rank 1 hangs
    try:
        # named by its heartbeat while the job still runs, before the collective timeout
        first = proc.stderr.readline()
        running = proc.poll() is None
        _, err = proc.communicate(timeout=120)
    finally:
        for r in ranks:
            if alive(r):
                os.kill(r, signal.SIGKILL)
    assert f"rank 1 (pid {ranks[1]}) is stopped (SIGSTOP" in first and running, first + err
    assert "collective timeout (10 s)" in first
    assert proc.returncode == 1
    [error] = [x for x in err.splitlines() if x.startswith("python -m minipar.train: error:")]
    assert f"rank 1 hung (pid {ranks[1]}, stopped" in error, err
    assert "gave up waiting for it" in error or "left waiting for it" in error
    assert "Traceback" not in err and error == err.splitlines()[0]    # the cause, once


def sleep_on_rank_1_at(step_to_hang: int, seconds: float):
    """A Trainer.probe that leaves rank 1 in Python, outside any collective, at one step
    (the forked ranks inherit the patch)."""
    from minipar.trainer import step as train_module
    probe = train_module.Trainer.probe

    def stuck(self, step):
        if step == step_to_hang and self.grid.rank == 1:
            time.sleep(seconds)
        return probe(self, step)
    return stuck


def test_a_rank_stuck_outside_the_collective_is_named_not_the_ranks_that_timed_out(
        monkeypatch, capsys):
    from minipar.runtime import run
    from minipar.trainer import step as train_module
    monkeypatch.setattr(train_module.Trainer, "probe", sleep_on_rank_1_at(1, 600))
    code = run.main(["--dp", "3", "--global-batch", "6", "--steps", "3",
                     "--no-progress", "--timeout-s", "3"])
    err = capsys.readouterr().err
    assert code == 1, err
    first = err.splitlines()[0]
    assert "rank 1 hung (pid" in first and "never joined the collective" in first, err
    assert "ranks [0, 2] gave up waiting for it" in first
    assert "Traceback" not in err


@pytest.mark.timeout(300)
def test_torchrun_agent_sigterm_stops_its_ranks_at_a_step_and_saves(tmp_path, repo_root):
    """Under `python -m minipar.torchrun` (torchrun's agent) SIGTERM to the agent reaches
    its workers: they agree on a step, checkpoint there, and exit; the agent ends with rank
    0's one line and 143, not its SignalException traceback; nothing is left."""
    save = tmp_path / "ckpt"
    proc, log = start_torchrun(tmp_path, repo_root, "--save", str(save))
    workers = [c for c in children(proc.pid)]
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(1)
    assert len(workers) == 2 and not [w for w in workers if alive(w)]
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    [line] = err.strip().splitlines()
    assert "stopped by SIGTERM after" in line and "checkpoint saved to" in line, err[-3000:]
    step_dir = checkpoint.latest(str(save))
    rows = log.read_text().splitlines()
    assert checkpoint.read_manifest(step_dir)["step"] == len(rows)


def rank_of(pid: int) -> int:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return int(env[b"RANK"])


@pytest.mark.timeout(300)
def test_torchrun_a_stopped_rank_is_named_at_once_and_ends_the_job(tmp_path, repo_root):
    """Under torchrun gloo may wait forever on a stopped peer (its connections stay open):
    rank 0's heartbeat watch names rank 1 after a few seconds, and ends the job, naming it,
    once it has been silent for the collective timeout; nothing is left."""
    proc, log = start_torchrun(tmp_path, repo_root, "--timeout-s", "10",
                               agent_flags=("--shutdown-timeout", "5"))
    workers = {rank_of(w): w for w in children(proc.pid)}
    os.kill(workers[1], signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for w in workers.values():
            if alive(w):
                os.kill(w, signal.SIGKILL)
    assert proc.returncode == 1, err[-3000:]
    lines = err.splitlines()
    said = [i for i, x in enumerate(lines) if "rank 1 on node 0" in x and "has not beaten" in x]
    ended = [i for i, x in enumerate(lines) if "rank 1 on node 0" in x and " hung: " in x]
    assert said and ended and said[0] < ended[0], err[-3000:]
    assert "collective timeout (10 s)" in lines[said[0]] and "Traceback" not in err
    assert lines[-1].startswith("python -m minipar.torchrun: error: rank 0"), err[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_torchrun_wrapper_turns_the_agents_signal_into_one_line(signum, monkeypatch, capsys):
    """torchrun's agent raises SignalException once it has stopped its workers: one line
    (rank 0's, when it left one), 128 + the signal; a worker that failed is named."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from minipar.runtime import run, torchrun

    def agent(argv, rank0_line=None):
        assert argv == ["--standalone", "-m", "minipar.train"]
        if rank0_line:           # what rank 0 of a stopped run leaves for the agent
            with open(os.environ[run.END_LINE_ENV], "w") as f:
                f.write(rank0_line + "\n")
        raise SignalException("got signal", sigval=signal.Signals(signum))
    argv = ["--standalone", "-m", "minipar.train"]
    for said in (None, "python -m minipar.train: stopped by X after 3 steps"):
        monkeypatch.setattr(torchrun.torch_run, "main", lambda a: agent(a, said))
        assert torchrun.main(argv) == 128 + signum
        [line] = capsys.readouterr().err.splitlines()
        assert line == said if said else line.startswith(
            f"{torchrun.PROG}: stopped by {signal.Signals(signum).name}; this node's workers "
            "were stopped (no step boundary reported here")
    assert run.END_LINE_ENV not in os.environ

    def failed(argv):
        raise ChildFailedError("minipar.train", {1: ProcessFailure(1, 4242, 1, "<N/A>")})
    monkeypatch.setattr(torchrun.torch_run, "main", failed)
    assert torchrun.main(argv) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "rank 1 (local rank 1, pid 4242) exited with 1" in line
