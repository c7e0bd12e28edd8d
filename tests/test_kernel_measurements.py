"""The kernel measurements an H200 made for the cost model (benchmarks/kernels/), checked
for what they claim: every GEMM and block shape of the published runs was timed, and each
number is a physical one (below the data-sheet peak, above nothing)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "benchmarks" / "kernels"
DATA = ROOT / "minipar" / "plan" / "costmodel" / "data"       # where the cost model reads them
PEAK = 989.4e12


def test_shapes_file_is_what_shapes_py_writes(tmp_path):
    # the published runs' shapes today are the ones the GPU timed
    out = tmp_path / "shapes.json"
    subprocess.run([sys.executable, str(KERNELS / "shapes.py"), str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    assert json.loads(out.read_text()) == json.loads((KERNELS / "shapes.json").read_text())


def test_every_shape_was_measured_and_is_physical():
    shapes = json.loads((KERNELS / "shapes.json").read_text())
    for path in (DATA / "kernels_h200.json", KERNELS / "kernels_h200_first_run.json"):
        got = json.loads(path.read_text())
        assert got["gpu"] == "NVIDIA H200"
        timed = {(g["m"], g["n"], g["k"]): g["s"] for g in got["gemms"]}
        assert set(map(tuple, shapes["gemms"])) == set(timed)
        for (m, n, k), s in timed.items():
            assert 0 < 2 * m * n * k / s < PEAK, (m, n, k)
        assert len(got["layers"]) == len(shapes["layers"])
        for row in got["attention"]["flash"] + got["attention"].get("cudnn", []):
            assert 0 < 3 * row["flops_fwd"] / row["fwd_bwd_s"] < PEAK
        assert 0.5 < got["hbm"]["copy_Bps"] / 4.8e12 < 1


def test_cp_attention_measurement_covers_every_rank():
    got = json.loads((DATA / "cp_attention_h200.json").read_text())
    for backend in ("flash", "cudnn"):
        ranks = got["ranks"][backend]
        assert [r["rank"] for r in ranks] == list(range(got["cp"]))
        # the zigzag balances the work: every rank does the same FLOPs within a percent
        flops = [r["flops"] for r in ranks]
        assert max(flops) / min(flops) < 1.01
        assert all(0 < r["flops"] / r["fwd_bwd_s"] < PEAK for r in ranks)
