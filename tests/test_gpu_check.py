"""benchmarks/gpu_check.sh on the CPU (`--cpu`): every step runs, tiny, and the one JSON
summary has its keys and the steps' real results. On a GPU the same script runs the same
steps with MINIPAR_DEVICE=cuda and the 1B model; that run is not part of `make test`."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import gpu_check  # noqa: E402


@pytest.mark.slow
def test_gpu_check_in_cpu_mode_writes_its_summary(tmp_path, repo_root):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu", "--out", str(out)], cwd=repo_root,
                       env=env, capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert tuple(s) == gpu_check.KEYS
    assert s["mode"] == "cpu" and s["ok"], s["steps"]
    assert list(s["steps"]) == ["tests", "train", "mfu"]
    assert s["tests"]["passed"] >= 1 and s["tests"]["failed"] == 0
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert s["train"]["steps"] == len(rows) == 5
    assert s["train"]["loss_last"] == rows[-1]["loss"]
    assert s["gpu_mfu"] == {"gpu": None, "rows": []}       # no GPU: nothing measured, said so
    assert "all steps ok" in p.stdout


def test_a_failed_step_is_reported_not_filled_in(tmp_path):
    (tmp_path / "steps.tsv").write_text("tests\t0\t1.5\ntrain\t124\t240.0\n")
    s = gpu_check.summary(tmp_path, "cuda")
    assert s["ok"] is False and s["steps"]["train"]["exit_status"] == 124
    assert s["train"] is None and s["tests"] is None and s["gpu_mfu"] is None


def test_top_costs_names_the_operator_that_dominates_a_step():
    import torch
    import gpu_mfu
    a, b = torch.randn(256, 256), torch.randn(256, 8)

    def step():
        for _ in range(20):
            a @ a          # the big one
        a @ b

    costs = gpu_mfu.top_costs(step, "cpu", k=3)
    assert costs[0]["op"] == "aten::mm" and costs[0]["calls"] == 21
    assert 0 < sum(c["share"] for c in costs) <= 1 + 1e-9
