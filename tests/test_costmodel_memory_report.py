"""The cost model beside every published peak-memory figure (`evaluate.memory_comparison`)."""
from minipar.plan.costmodel import evaluate
from minipar.plan.costmodel.calibration import GIB, MEMORY_FILE, _rows, heatmap_cells, memory_rows
from minipar.plan.costmodel.time import step_estimate


def test_memory_file_loads_with_its_sources():
    rows = _rows(MEMORY_FILE)
    assert {r["source"] for r in rows} == {"torchtitan-performance", "playbook-bench-allocated"}
    assert {r["measured"] for r in rows} == {"reserved", "allocated"}
    assert sum(r["source"] == "torchtitan-performance" for r in rows) == 18
    assert sum(r["source"] == "playbook-bench-allocated" for r in rows) == len(heatmap_cells()) == 26
    header = "".join(line for line in open(MEMORY_FILE) if line.startswith("#"))
    for where in ("pytorch/torchtitan", "docs/performance.md", "d4c86e375", "9dec370",
                  "max_memory_allocated", "reserved_bytes.all.peak", "GiB"):
        assert where in header


def test_every_row_is_predicted_and_error_is_predicted_minus_published():
    rows = evaluate.memory_comparison()
    assert len(rows) == len(memory_rows()) == 26 + 18 + 26
    for r in rows:
        assert r["predicted_gb"] > 0 and r["published_gb"] > 0
        assert r["error_gb"] == r["predicted_gb"] - r["published_gb"]
        assert r["published_gb"] == r["published_gib"] * GIB
        assert 0 < r["states_gb"] <= r["predicted_gb"]
        assert r["measured"] in ("reserved", "allocated")


def test_prediction_is_the_estimate_of_the_same_run():
    for m, r in zip(memory_rows(), evaluate.memory_comparison()):
        assert r["predicted_gb"] == step_estimate(m.run.scenario).memory_gb_per_gpu
        assert r["label"] == m.run.label


def test_hand_checked_row_torchtitan_8b_fsdp_on_8_gpus():
    row = next(r for r in evaluate.memory_comparison()
               if r["source"] == "torchtitan-performance" and r["ref"] == "Table 1 FSDP")
    assert row["label"] == "llama3-8b 8 GPUs TP1 CP1 PP1 DP8 seq 8192"
    assert row["published_gib"] == 82.4                     # docs/performance.md, Table 1
    assert row["published_gb"] == 82.4 * GIB                # GiB -> GB
    assert abs(row["published_gb"] - 88.476) < 1e-3
    assert row["measured"] == "reserved" and not row["float8"]
    run = next(m.run for m in memory_rows() if m.ref == "Table 1 FSDP")
    assert run.framework == "torchtitan" and run.parallel.zero == 3      # FSDP without PP
    assert run.work.microbatch_size == 2 and run.work.recompute == "selective"
    assert run.parallel.microbatches == 1 and run.cluster.hbm_gb == 96.0


def test_heatmap_rows_are_reserved_gib():
    heat = [r for r in evaluate.memory_comparison() if r["ref"] == "heatmap cell"]
    assert [r["published_gib"] for r in heat] == [gib for _, gib in heatmap_cells()]
    assert all(r["measured"] == "reserved" for r in heat)
    assert GIB == 1.073741824


def test_report_has_a_line_per_row_and_the_summary_per_source():
    rows = evaluate.memory_comparison()
    text = evaluate.memory_report(rows)
    lines = text.splitlines()
    summary = evaluate.memory_summary(rows)
    assert list(summary) == ["ultrascale-playbook-heatmap", "torchtitan-performance",
                             "torchtitan-performance (float8)", "playbook-bench-allocated"]
    assert len(lines) == 2 + len(rows) + len(summary)
    body = lines[2:2 + len(rows)]
    for r, line in zip(rows, body):
        assert r["ref"][:36] in line and f"{r['error_gb']:+6.1f}" in line
        assert ("float8" in line) == r["float8"]
    for name, s in summary.items():
        assert any(line.startswith(name) and f"{s['mean_signed_error_gb']:+6.1f} GB" in line
                   for line in lines[2 + len(rows):])
    assert sum(s["rows"] for s in summary.values()) == len(rows)


def test_summary_sign_and_worst():
    rows = evaluate.memory_comparison()
    for name, s in evaluate.memory_summary(rows).items():
        mine = [r["error_gb"] for r in rows
                if r["source"] + (" (float8)" if r["float8"] else "") == name]
        assert abs(s["mean_signed_error_gb"] - sum(mine) / len(mine)) < 1e-12
        assert s["worst_error_gb"] in mine and abs(s["worst_error_gb"]) == max(map(abs, mine))
    # tensors only: every reserved figure is under-counted
    assert all(r["error_gb"] < 0 for r in rows if r["measured"] == "reserved")


def test_evaluation_json_carries_memory():
    out = evaluate.evaluation()
    assert len(out["memory"]["rows"]) == 70
    assert set(out["memory"]["sources"]) == set(evaluate.memory_summary(out["memory"]["rows"]))
