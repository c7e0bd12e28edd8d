"""The same `python -m minipar.train` under torchrun gives the built-in launcher's losses."""
import json
import os
import subprocess
import sys

import pytest

from helpers import losses, max_rel_diff, run_layout


@pytest.mark.slow
def test_torchrun_world_matches_forked_world(tmp_path, repo_root):
    log = tmp_path / "torchrun.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(repo_root) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "-m", "minipar.train", "--dp", "4", "--zero", "1", "--microbatches", "2",
           "--steps", "4", "--log-json", str(log), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    forked = run_layout(steps=4, dp=4, zero=1, microbatches=2, capture_grads=False)
    assert max_rel_diff([r["loss"] for r in rows], losses(forked)) <= 1e-6
