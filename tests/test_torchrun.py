"""The same `python -m minipar.train` under torchrun gives the built-in launcher's losses:
one node, and two "nodes" (two torchrun agents) on one machine, as on a cluster."""
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers import losses, max_rel_diff, run_layout
from minipar.trainer.grid import ProcessGrid


def clean_env(repo_root) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(repo_root) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.mark.slow
def test_torchrun_world_matches_forked_world(tmp_path, repo_root):
    log = tmp_path / "torchrun.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "-m", "minipar.train", "--dp", "4", "--zero", "1", "--microbatches", "2",
           "--steps", "4", "--log-json", str(log), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=clean_env(repo_root),
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    forked = run_layout(steps=4, dp=4, zero=1, microbatches=2, capture_grads=False)
    assert max_rel_diff([r["loss"] for r in rows], losses(forked)) <= 1e-6


# ------------------------------------------------------------ two nodes on one machine
# Each agent is one node. The flags are examples/slurm_train.sbatch's (tested below);
# there the endpoint is the first node's host name and the node rank Slurm's SLURM_NODEID.
# With the c10d rendezvous torchrun numbers the nodes itself (GROUP_RANK) and ignores
# --node-rank, so the tests below find out from the processes which node holds which rank.
def agent_cmd(node_rank: int, port: int, nproc: int, train_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "minipar.torchrun",      # torchrun, one line on a signal
            "--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "minipar-two-nodes",
            "-m", "minipar.train", *train_args]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_nodes(tmp_path, repo_root, port, nproc, train_args) -> list[subprocess.Popen]:
    """Node 0 first, so that it hosts the rendezvous (the head node of a Slurm job), then
    node 1. Each agent's output goes to node<i>.log."""
    agents = []
    for i in range(2):
        out = open(tmp_path / f"node{i}.log", "w")
        agents.append(subprocess.Popen(agent_cmd(i, port, nproc, train_args), stdout=out,
                                       stderr=subprocess.STDOUT, env=clean_env(repo_root),
                                       cwd=tmp_path))
        deadline = time.monotonic() + 120
        while i == 0 and not listening(port) and agents[0].poll() is None:
            assert time.monotonic() < deadline, "node 0 never opened the rendezvous port"
            time.sleep(0.1)
    return agents


def workers_of(agent_pid: int) -> dict[int, dict]:
    """{pid: environment} of the processes `agent_pid` started as ranks (read from /proc:
    what torchrun really told each worker, not what minipar computes)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != agent_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
        except (OSError, IndexError, ValueError):
            continue          # it exited while we looked
        if "RANK" in env:
            out[int(d)] = env
    return out


def watch(agents, until, timeout_s: float = 300) -> dict[int, dict]:
    """Poll the agents' workers until `until()`; returns {rank: where} with the index of the
    agent (node) that started it, its pid and torchrun's GROUP_RANK and LOCAL_RANK."""
    seen, deadline = {}, time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "the two-node job did not finish in time"
        for node, a in enumerate(agents):
            for pid, env in workers_of(a.pid).items():
                seen[int(env["RANK"])] = {"node": node, "pid": pid, "group_rank": env["GROUP_RANK"],
                                          "local_rank": env["LOCAL_RANK"]}
        time.sleep(0.2)
    return seen


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie is dead
    except OSError:
        return False


def stop_all(agents, seen):
    for a in agents:
        if a.poll() is None:
            a.kill()
            a.wait()
    for w in seen.values():
        if alive(w["pid"]):
            with contextlib.suppress(ProcessLookupError):     # it ended meanwhile
                os.kill(w["pid"], signal.SIGKILL)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the ranks' placement from /proc")
@pytest.mark.slow
@pytest.mark.parametrize("layout,inner", [({"tp": 2, "dp": 2}, "tp"), ({"pp": 2, "dp": 2}, "pp")])
def test_two_nodes_match_the_local_launcher_and_keep_the_inner_axis_inside_a_node(
        tmp_path, repo_root, free_port, layout, inner):
    log = tmp_path / "two_nodes.jsonl"
    flags = [f for axis, n in layout.items() for f in (f"--{axis}", str(n))]
    agents = start_nodes(tmp_path, repo_root, free_port, 2,
                         [*flags, "--steps", "3", "--log-json", str(log), "--no-progress"])
    try:
        seen = watch(agents, until=lambda: all(a.poll() is not None for a in agents))
    finally:
        stop_all(agents, {})
    for i, a in enumerate(agents):
        assert a.returncode == 0, (tmp_path / f"node{i}.log").read_text()[-3000:]

    # the losses of the built-in launcher's four forked ranks
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    forked = run_layout(steps=3, capture_grads=False, **layout)
    assert max_rel_diff([r["loss"] for r in rows], losses(forked)) <= 1e-6

    # where the ranks ran: two per node, and torchrun's node number agrees with the agent
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, w in seen.items():       # torchrun's numbering, which the chapter states
        assert rank == int(w["group_rank"]) * 2 + int(w["local_rank"])
    for node in range(2):
        assert sorted(w["local_rank"] for w in seen.values() if w["node"] == node) == ["0", "1"]
        assert len({w["group_rank"] for w in seen.values() if w["node"] == node}) == 1
    # the chapter's rule: the inner axis inside a node, DP across the nodes
    grid = ProcessGrid(**layout)
    for group in grid.all_groups(inner):
        assert len({seen[r]["node"] for r in group}) == 1, f"{inner} group {group} spans nodes"
    for group in grid.all_groups("dp"):
        assert len({seen[r]["node"] for r in group}) == 2, f"dp group {group} inside one node"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the ranks' placement from /proc")
@pytest.mark.slow
def test_losing_a_node_ends_the_job_with_an_error_naming_it(tmp_path, repo_root, free_port):
    """Node 1 loses power (its agent and its rank are killed at once). The rank on node 0
    fails its all-reduce, names the lost rank and its node, and node 0's agent exits
    non-zero; nothing is left running."""
    log = tmp_path / "run.jsonl"
    agents = start_nodes(tmp_path, repo_root, free_port, 1,
                         ["--dp", "2", "--steps", "100000", "--timeout-s", "60",
                          "--log-json", str(log), "--no-progress"])
    seen = {}
    try:
        seen = watch(agents, until=lambda: (log.exists() and log.read_text().count("\n") >= 1)
                     or any(a.poll() is not None for a in agents))
        assert all(a.poll() is None for a in agents), (tmp_path / "node0.log").read_text()[-3000:]
        lost = [r for r, w in seen.items() if w["node"] == 1]
        assert len(lost) == 1 and len(seen) == 2
        agents[1].kill()
        with contextlib.suppress(ProcessLookupError):     # gone already with its agent
            os.kill(seen[lost[0]]["pid"], signal.SIGKILL)
        agents[0].wait(timeout=120)           # a hang fails here
    finally:
        stop_all(agents, seen)
    out = (tmp_path / "node0.log").read_text()
    assert agents[0].returncode != 0, out[-3000:]
    where = f"rank {lost[0]} on node {seen[lost[0]]['group_rank']}"
    assert re.search(rf"lost {where} \(.*\) \(heartbeat stopped\)", out), out[-3000:]
    time.sleep(1)
    assert not [w["pid"] for w in seen.values() if alive(w["pid"])], "a rank outlived the job"


def test_the_slurm_example_uses_the_tested_torchrun_flags(repo_root):
    text = (repo_root / "examples" / "slurm_train.sbatch").read_text()
    line = re.search(r"^[^#\n]*python -m minipar\.torchrun (.*?) -m minipar\.train",
                     text.replace("\\\n", " "), re.M)
    assert line, "no `python -m minipar.torchrun ... -m minipar.train` in examples/slurm_train.sbatch"
    assert agent_cmd(0, 0, 2, [])[1:3] == ["-m", "minipar.torchrun"]    # what the tests run
    flags = [t for t in shlex.split(line.group(1)) if t.startswith("--")]
    tested = [t for t in agent_cmd(0, 0, 2, [])[3:] if t.startswith("--")]
    assert flags == tested


# ------------------------------------------------------------ heartbeats through a store
def test_heartbeats_name_a_silent_rank_at_once_and_a_rank_that_never_joined(monkeypatch, free_port):
    """Two ranks' heartbeats in one process, through a store like torchrun's. Rank 1 stops
    beating: rank 0's watch names it within a few periods, long before any collective
    timeout, the roll call after a failure calls it lost, and silent for a whole collective
    timeout it ends the job. A rank that beats but never joined the collective its peer
    timed out in is named as that; a rank that is done (stop()) is not taken for hung."""
    import torch.distributed as dist
    from minipar.runtime.heartbeat import StoreHeartbeat
    master = dist.TCPStore("127.0.0.1", free_port, is_master=True, wait_for_workers=False)  # noqa: F841
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port))
    fast = dict(period_s=0.1, silent_s=1.0, roll_call_s=0.5, collective_timeout_s=600)

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "beating")
    beats = [StoreHeartbeat(r, 2, **fast) for r in range(2)]
    timeout = RuntimeError("[gloo] Timed out waiting 600000ms for recv operation to complete")
    line = beats[0].explain(timeout).splitlines()[0]
    assert "timed out waiting for rank 1 on node" in line and "never joined" in line, line
    assert not beats[0].warnings

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "silent")
    watcher, silent = StoreHeartbeat(0, 2, **fast), StoreHeartbeat(1, 2, **fast)
    hangs = []
    watcher.hang = lambda *a: hangs.append(a)      # instead of ending this process
    deadline = time.monotonic() + 60
    while watcher.store.add("beat/1", 0) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    silent._stop.set()                     # rank 1 hangs: no beat (not stop(): "I am done")
    while not watcher.warnings:
        assert time.monotonic() < deadline, "the silent rank was never named"
        time.sleep(0.05)
    [warning] = watcher.warnings
    assert "rank 1 on node" in warning and "collective timeout (600 s)" in warning
    assert "lost rank 1 on node" in watcher.explain(timeout)
    assert not hangs                       # 600 s: the job goes on
    watcher.collective_timeout_s = 2.0     # silent for a whole timeout: the job ends
    while not hangs:
        assert time.monotonic() < deadline, "a rank silent for the timeout did not end the job"
        time.sleep(0.05)
    assert hangs[0][0] == 1 and hangs[0][1] >= 2.0       # (rank, seconds silent)
    # a rank that is done says so (stop()): silent from then on, but not hung
    watcher.stop()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "done")
    watcher = StoreHeartbeat(0, 2, **{**fast, "collective_timeout_s": 2.0})
    done = StoreHeartbeat(1, 2, **fast)
    hangs = []
    watcher.hang = lambda *a: hangs.append(a)
    while watcher.store.add("beat/1", 0) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    done.stop()
    time.sleep(3.0)
    assert not watcher.warnings and not hangs and watcher._thread.is_alive()
    for b in [*beats, watcher, silent]:
        b.stop()
