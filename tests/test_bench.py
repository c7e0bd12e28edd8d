"""The benchmarks still run: `make bench` is measured, never asserted on (speed is judged by
the ratio a run prints), but a benchmark that no longer calls the code it measures must
fail here, not on a reader's machine. Only the peers whose code has moved under them: the
pipeline executor takes (tokens, targets, positions) micro-batches."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_pipeline_benchmark_runs_and_both_sides_do_the_same_work(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "benchmarks/peers.py", "--quick", "--only",
                          "pp_vs_torch_pipelining", "--json", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "pp_vs_torch_pipelining" in run.stdout
    result = json.loads(out.read_text())["pp_vs_torch_pipelining"]
    assert result["minipar_s"] > 0 and result["peer_s"] > 0
    assert result["weights_max_abs_diff"] <= 1e-5     # the same steps on the same data
