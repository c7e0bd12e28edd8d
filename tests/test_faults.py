"""Faults: a rank killed with --fail-at-step ends the job fast with an error naming it;
with --max-restarts the world restarts from the latest checkpoint and the loss curve is
the uninterrupted one, logged once."""
from __future__ import annotations

import json
import os
import time

import pytest

from helpers import losses
from minipar.plan.config import ParallelConfig
from minipar.plan.config import TrainConfig
from minipar.runtime.run import main, train

pytestmark = pytest.mark.slow

STEPS = 6
LAYOUT = ["--dp", "2", "--zero", "1", "--steps", str(STEPS), "--no-progress"]


@pytest.fixture(scope="module")
def uninterrupted():
    cfg = TrainConfig(parallel=ParallelConfig(dp=2, zero=1), steps=STEPS, progress=False)
    return losses(train(cfg))


def read_log(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.parametrize("rank,step", [(1, 2), (0, 0)])
def test_a_killed_rank_is_named_and_the_job_ends_within_the_timeout(rank, step, capsys):
    timeout = 45     # generous for a loaded 2-core machine; a hang would wait the full timeout
    t0 = time.monotonic()
    code = main([*LAYOUT, "--fail-at-step", str(step), "--fail-rank", str(rank),
                 "--timeout-s", str(timeout)])
    elapsed = time.monotonic() - t0
    assert code == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert f"rank {rank} died" in first, first
    assert elapsed < timeout


@pytest.mark.parametrize("save_every,fail_at,resumed", [(2, 3, True), (4, 1, False)],
                         ids=["from-checkpoint", "before-any-checkpoint"])
def test_kill_and_restart_equals_uninterrupted(tmp_path, uninterrupted, save_every, fail_at, resumed):
    save, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    cfg = TrainConfig(parallel=ParallelConfig(dp=2, zero=1), steps=STEPS, progress=False,
                      save=save, save_every=save_every, fail_at_step=fail_at, fail_rank=1,
                      max_restarts=1, log_json=log)
    out = train(cfg)
    [failure] = out["failures"]
    assert failure["rank"] == 1 and "rank 1 died" in failure["error"]
    # with a checkpoint (step 2) the restart resumes from it; without one, from the start
    assert failure["resumed_from"] == (save if resumed else None)
    assert failure["resumed_at_step"] == (2 if resumed else 0)
    assert losses(out) == uninterrupted          # same layout: bit for bit
    rows = read_log(log)
    assert [r["step"] for r in rows] == list(range(STEPS))      # every step once
    assert [r["loss"] for r in rows] == uninterrupted


def test_the_cli_restarts_and_says_so(tmp_path, uninterrupted, capfd):
    save, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    code = main([*LAYOUT, "--save", save, "--save-every", "2", "--fail-at-step", "5",
                 "--fail-rank", "0", "--max-restarts", "2", "--log-json", log])
    assert code == 0
    out, err = capfd.readouterr()       # fd-level: the line of the forked rank is there too
    assert "(after 1 restart(s))" in out
    # the injected failure and the restart on stderr, even with --no-progress
    assert "rank 0: injected failure at step 5 (--fail-at-step)" in err
    assert "rank 0 died" in err and f"restart 1/2 from {save}" in err
    assert "Traceback" not in err
    assert [r["loss"] for r in read_log(log)] == uninterrupted
    assert sorted(os.listdir(save)) == [".minipar", "latest", "step_000002", "step_000004",
                                        "step_000006"]


@pytest.mark.timeout(400)
def test_torchrun_restarts_resume_from_the_latest_checkpoint(tmp_path, repo_root, uninterrupted):
    """torchrun's own --max-restarts: the restarted workers see TORCHELASTIC_RESTART_COUNT
    and resume from --save's latest checkpoint; the fault is not injected again."""
    import subprocess
    import sys
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(repo_root) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    # torch 2.13: a restarted worker group sharing the rendezvous store can read the last
    # attempt's gloo addresses and fail to connect (pytorch#135712); a store per attempt
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", "-m", "minipar.train", *LAYOUT, "--save", str(tmp_path / "ckpt"),
           "--save-every", "2", "--fail-at-step", "3", "--fail-rank", "1", "--log-json", str(log),
           "--timeout-s", "60"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=380, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_log(log)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert max(abs(r["loss"] - u) / u for r, u in zip(rows, uninterrupted)) <= 1e-6
