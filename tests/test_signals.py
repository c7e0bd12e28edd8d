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

from minipar import checkpoint

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
    deadline = time.monotonic() + 180
    while not (log.exists() and log.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no step within 180 s"
        time.sleep(0.2)
    ranks = children(proc.pid)
    assert len(ranks) == 2, ranks
    return proc, ranks, log


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


def test_ctrl_c_stops_every_rank_and_exits_130(tmp_path, repo_root):
    proc, ranks, _ = start(tmp_path, repo_root)
    os.killpg(proc.pid, signal.SIGINT)           # a terminal's Ctrl-C: the whole group
    err = finish(proc, ranks, 128 + signal.SIGINT)
    [line] = err.strip().splitlines()
    assert "stopped by SIGINT" in line and "no checkpoint" in line


def test_a_stopped_rank_is_named_not_the_rank_that_waited(tmp_path, repo_root):
    proc, ranks, _ = start(tmp_path, repo_root, "--timeout-s", "5")
    os.kill(ranks[1], signal.SIGSTOP)            # alive, silent: rank 1 hangs
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        for r in ranks:
            if alive(r):
                os.kill(r, signal.SIGKILL)
    assert proc.returncode == 1
    first = err.splitlines()[0]
    assert f"rank 1 hung (pid {ranks[1]}, stopped" in first, err
    assert "gave up waiting for it" in first or "left waiting for it" in first


@pytest.mark.timeout(300)
def test_torchrun_agent_sigterm_stops_its_ranks_at_a_step_and_saves(tmp_path, repo_root):
    """Under torchrun the agent passes SIGTERM on to its workers: they agree on a step,
    checkpoint there, and exit; nothing is left."""
    save, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env.update(PYTHONPATH=str(repo_root), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", "-m", "minipar.train", "--dp", "2",
                             "--steps", "100000", "--no-progress", "--log-json", str(log),
                             "--save", str(save)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (log.exists() and log.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no step within 240 s"
        time.sleep(0.2)
    workers = [c for c in children(proc.pid)]
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(1)
    assert not [w for w in workers if alive(w)]
    # torchrun's agent prints its own SignalException traceback (torch's code, not ours);
    # no frame of a rank may appear
    frames = [x for x in err.splitlines() if x.strip().startswith('File "')]
    assert not [f for f in frames if "minipar" in f] and "KeyboardInterrupt" not in err, err[-3000:]
    assert "stopped by SIGTERM after" in err and "checkpoint saved to" in err, err[-3000:]
    step_dir = checkpoint.latest(str(save))
    rows = log.read_text().splitlines()
    assert checkpoint.read_manifest(step_dir)["step"] == len(rows)
