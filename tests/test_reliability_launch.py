"""No rank outlives its launcher, whatever ends it; the launcher's environment probes.

Issue 30's probes of the launcher: `kill -9` of `python -m minipar.train` (forked ranks)
or of `python -m minipar.torchrun`'s agent leaves no rank training (the kernel's parent-death
signal, `launch.die_with_parent`); SIGHUP and SIGUSR1 (Slurm's `--signal=USR1@T`) stop a run
like SIGTERM; a busy `--master-port` is one line and exit 2; RANK / WORLD_SIZE / MASTER_ADDR
left in a shell do not make a torchrun world; a rank SIGKILLed (the OOM killer's way) is
reported as killed, with the memory cgroup's count of OOM kills.

The process tests start the command in a session of its own, with the test's tmp_path in
its command line: every process it starts (forked ranks, torchrun's workers) carries that
marker, so "nothing is left" is read from /proc, whoever their parent is by then.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from minipar.runtime import checkpoint, launch, torchrun
from minipar.runtime.run import main


def processes() -> dict[int, tuple[str, int, str]]:
    """{pid: (state, parent pid, command line)} of every process, from /proc."""
    out = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue       # gone meanwhile
        out[int(entry)] = state, int(ppid), cmdline
    return out


def marked(marker: str) -> list[int]:
    """The live processes (not zombies) whose command line holds `marker`."""
    return [pid for pid, (state, _, cmd) in processes().items()
            if marker in cmd and state != "Z" and pid != os.getpid()]


def my_children() -> set[int]:
    """This process's live children."""
    return {pid for pid, (state, ppid, _) in processes().items()
            if ppid == os.getpid() and state != "Z"}


def assert_none_left(marker: str, within_s: float = 5.0):
    """Every process carrying `marker` ends within `within_s` (else it is killed, and the
    test fails naming it)."""
    deadline = time.monotonic() + within_s
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = marked(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes {left} outlived their launcher"


def start(tmp_path, repo_root, *cmd, steps=100_000):
    """`python -m <cmd> --dp 2 ...` in its own session, logging into tmp_path (the marker);
    returns it and its log once a step has been logged."""
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env.update(PYTHONPATH=str(repo_root), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", *cmd, "--dp", "2", "--steps", str(steps),
                             "--no-progress", "--log-json", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (log.exists() and log.read_text().count("\n") >= 1):
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):     # it has ended
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no step logged: {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    return proc, log


def snapshot(save) -> dict:
    """What a --save directory holds: each entry and its size/mtime, `latest`'s target."""
    return {p.name: (p.stat().st_mtime_ns, p.is_dir()) for p in save.iterdir()} | {
        "-> latest": checkpoint.latest(str(save))}


# ------------------------------------------------------------ kill -9 of the launcher
@pytest.mark.slow
def test_kill_9_of_the_launcher_takes_every_rank_with_it_and_no_checkpoint_follows(
        tmp_path, repo_root):
    save = tmp_path / "ckpt"
    proc, _ = start(tmp_path, repo_root, "minipar.train", "--save", str(save),
                    "--save-every", "1")
    ranks = marked(str(tmp_path))
    assert proc.pid in ranks and len(ranks) == 3, ranks      # the launcher and 2 ranks
    proc.kill()                     # SIGKILL: the launcher runs no code of its own
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert_none_left(str(tmp_path))
    before = snapshot(save)
    time.sleep(1.5)                 # at least a step's time: nobody writes checkpoints
    assert snapshot(save) == before


# ------------------------------------------------------------ SIGHUP, SIGUSR1 = SIGTERM
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1])
def test_sighup_and_slurms_sigusr1_stop_at_a_step_checkpoint_and_exit_128_plus(
        signum, tmp_path, repo_root):
    save = tmp_path / "ckpt"
    proc, log = start(tmp_path, repo_root, "minipar.train", "--save", str(save),
                      "--save-every", "1000")
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        assert_none_left(str(tmp_path))
    assert proc.returncode == 128 + signum, err[-3000:]
    [line] = err.strip().splitlines()
    assert f"stopped by {signal.Signals(signum).name} after" in line, line
    step_dir = checkpoint.latest(str(save))
    assert f"checkpoint saved to {step_dir}" in line, line
    # nothing lost: the checkpoint holds every step the log shows
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert checkpoint.read_manifest(step_dir)["step"] == len(rows)


def test_every_stop_signal_is_handled_where_ranks_run_and_where_none_does():
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1} <= set(
        launch.STOP_SIGNALS)
    assert torchrun.STOP_STATUSES == {128 + s for s in launch.STOP_SIGNALS}
    assert "SIGUSR1" in torchrun.AGENT_SIGNALS.split(",")


# ------------------------------------------------------------ torchrun's agent
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_of_the_torchrun_agent_takes_its_workers_with_it(tmp_path, repo_root):
    proc, _ = start(tmp_path, repo_root, "minipar.torchrun", "--standalone",
                    "--nproc-per-node", "2", "-m", "minipar.train")
    workers = [p for p in marked(str(tmp_path)) if p != proc.pid]
    assert len(workers) == 2, workers
    proc.kill()
    proc.wait(timeout=10)
    assert_none_left(str(tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigusr1_to_the_torchrun_agent_stops_its_workers_at_a_step_and_exits_138(
        tmp_path, repo_root):
    """torch's agent handles TERM, INT, HUP and QUIT; `minipar.torchrun` adds Slurm's USR1."""
    save = tmp_path / "ckpt"
    proc, log = start(tmp_path, repo_root, "minipar.torchrun", "--standalone",
                      "--nproc-per-node", "2", "-m", "minipar.train", "--save", str(save))
    proc.send_signal(signal.SIGUSR1)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        assert_none_left(str(tmp_path))
    assert proc.returncode == 128 + signal.SIGUSR1, err[-3000:]
    [line] = err.strip().splitlines()
    assert "stopped by SIGUSR1 after" in line and "checkpoint saved to" in line, line
    step_dir = checkpoint.latest(str(save))
    assert checkpoint.read_manifest(step_dir)["step"] == len(log.read_text().splitlines())


def test_a_busy_master_port_is_one_line_and_exit_2_before_any_worker(tmp_path, repo_root):
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"}
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "minipar.torchrun", "--nproc-per-node", "2",
                            "--master-port", str(port), "-m", "minipar.train", "--dp", "2",
                            "--steps", "1", "--log-json", str(log)],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.splitlines() == [
        f"{torchrun.PROG}: error: --master-port {port} is in use (Address already in use): "
        "pick a free port, or leave the flag out (with --standalone torchrun picks one)"]
    assert not log.exists()          # no worker started


def test_the_master_port_is_checked_only_where_this_agent_would_host_it(monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        cmd = ["-m", "minipar.train"]
        assert "is in use" in torchrun.master_port_taken(["--master-port", port, *cmd])
        for elsewhere in (["--node-rank", "1"], ["--standalone"],
                          ["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1"]):
            assert torchrun.master_port_taken([*elsewhere, "--master-port", port, *cmd]) is None
    assert torchrun.master_port_taken(["--master-port", port, *cmd]) is None    # free now
    assert torchrun.master_port_taken(cmd) is None


def test_the_torchrun_agent_handles_sigusr1_and_names_a_sigkilled_worker(monkeypatch, capsys):
    """The agent is told to handle SIGUSR1 (torch's list has TERM, INT, HUP, QUIT), only
    while it runs, unless its --signals-to-handle says otherwise; a worker that exited -9
    is said to be killed, with the OOM hint."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    monkeypatch.delenv(torchrun.SIGNALS_ENV, raising=False)
    seen = []

    def agent(argv):       # what torchrun's own parser reads
        seen.append(torchrun.torch_run.parse_args(argv).signals_to_handle)
        raise ChildFailedError("minipar.train", {1: ProcessFailure(1, 4242, -9, "<N/A>")})
    monkeypatch.setattr(torchrun.torch_run, "main", agent)
    assert torchrun.main(["--standalone", "-m", "minipar.train"]) == 1
    assert "SIGUSR1" in seen[0].split(",") and torchrun.SIGNALS_ENV not in os.environ
    [line] = capsys.readouterr().err.splitlines()
    assert "rank 1 (local rank 1, pid 4242) was killed (SIGKILL, exit -9)" in line, line
    assert "OOM" in line
    assert torchrun.main(["--signals-to-handle", "SIGTERM", "--standalone", "-m", "x"]) == 1
    assert seen[1] == "SIGTERM"          # the user's flag wins


# ------------------------------------------------------------ leftover torchrun variables
def test_torchrun_variables_left_in_the_shell_do_not_make_a_torchrun_world(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.255.255.1")     # nowhere: joining would hang
    monkeypatch.setenv("MASTER_PORT", "29999")
    assert not launch.in_torchrun()
    t0 = time.monotonic()
    assert main(["--dp", "2", "--steps", "1", "--no-progress"]) == 0, capsys.readouterr().err
    assert time.monotonic() - t0 < 60 and "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")     # what torchrun's agent sets
    assert launch.in_torchrun()


# ------------------------------------------------------------ a rank the OOM killer ends
def die_on_rank_1():
    """A rank's function: rank 1 is SIGKILLed, as the OOM killer does it; rank 0 returns."""
    if int(os.environ["RANK"]) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return "done"


def fake_cgroups(tmp_path, v1: bool, kills: int, limit: str):
    """A cgroup mount under tmp_path with this process's memory cgroup `job` (v1 or v2),
    and the /proc/self/cgroup that names it."""
    kind, counts, cap = ("memory", "memory.oom_control", "memory.limit_in_bytes") if v1 else (
        "", "memory.events", "memory.max")
    job = tmp_path / "cgroup" / kind / "slurm" / "job_7"
    job.mkdir(parents=True)
    (job / counts).write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n" if v1
                              else f"low 0\nhigh 0\nmax 3\noom {kills}\noom_kill {kills}\n")
    (job / cap).write_text(limit + "\n")
    (tmp_path / "cgroup" / kind / counts).write_text("oom_kill 0\n")    # the machine's root
    (tmp_path / "cgroup" / kind / cap).write_text("max\n")
    mine = tmp_path / "self_cgroup"
    mine.write_text(f"4:{kind or 'cpu'}:/slurm/job_7\n0::/slurm/job_7\n" if v1
                    else "0::/slurm/job_7\n")
    return functools.partial(launch.oom_kills, str(tmp_path / "cgroup"), str(mine))


def test_a_rank_killed_by_sigkill_is_named_as_killed_with_the_cgroups_oom_count(
        tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "oom_kills", fake_cgroups(tmp_path, False, 2, str(2**30)))
    before = my_children()
    with pytest.raises(launch.RankFailed) as e:
        launch.run_local(die_on_rank_1, 2, timeout_s=30)
    first = str(e.value).splitlines()[0]
    assert e.value.rank == 1 and first.startswith(
        "rank 1 was killed (SIGKILL, exit -9) without an error report; most likely out of "
        "memory: its memory cgroup (limit 1.0 GiB) has counted 2 OOM kill(s)"), first
    assert not my_children() - before         # no rank left


@pytest.mark.parametrize("v1,kills,limit,said", [
    (True, 1, str(512 * 2**20), "its memory cgroup (limit 0.5 GiB) has counted 1 OOM kill(s)"),
    (True, 0, "9223372036854771712", "its memory cgroup (no limit) has counted 0 OOM kill(s)"),
    (False, 3, "max", "its memory cgroup (no limit) has counted 3"),
])
def test_the_oom_count_is_read_from_cgroup_v1_and_v2(tmp_path, monkeypatch, v1, kills, limit,
                                                     said):
    monkeypatch.setattr(launch, "oom_kills", fake_cgroups(tmp_path, v1, kills, limit))
    assert said in launch.death(-signal.SIGKILL)


def test_without_a_readable_cgroup_the_oom_killer_is_named_as_the_usual_cause(
        tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "oom_kills", functools.partial(
        launch.oom_kills, str(tmp_path / "none"), str(tmp_path / "none")))
    said = launch.death(-signal.SIGKILL)
    assert said.startswith("was killed (SIGKILL, exit -9)") and "OOM killer" in said
    assert launch.death(1) == "died (exit code 1) without an error report"
