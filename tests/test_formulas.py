"""minipar.plan.formulas: every closed form once, torch-free, and equal to what it replaced.

The formulas module is imported by the axis files, the cost model, the figures and the
tests; these tests pin (a) that it, flops and the cost model import with torch made
unimportable, (b) that the cost model's stage split is the executor's, including the layout
that used to raise IndexError, (c) that each formula gives the numbers of the copy it
replaced. Pure functions: milliseconds (one subprocess).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from minipar.plan import costmodel as cm
from minipar.plan import flops
from minipar.plan.formulas.collective_time import all_reduce_time
from minipar.plan.formulas.collectives import wire_bytes
from minipar.plan.formulas.context_parallel import cp_hops, cp_wire_bytes_per_step
from minipar.plan.formulas.memory import zero_bytes_per_param
from minipar.plan.flops import layer_param_count, param_count
from minipar.plan.flops import local_param_count
from minipar.plan.formulas.pipeline_parallel import bubble_fraction
from minipar.plan.schedules import split_layers, stage_layer_counts
from minipar.plan.formulas.tensor_parallel import tp_wire_bytes_breakdown
from minipar.plan.config import ConfigError, ModelConfig, ParallelConfig

TINY = ModelConfig.preset("tiny")       # 8 layers, dim 64, 8 heads (4 KV, head_dim 8), ffn 128, vocab 256
L405 = ModelConfig.preset("llama3-405b")


# ------------------------------------------------------------------ (a) no torch
def test_formulas_flops_and_costmodel_import_without_torch(repo_root):
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None          # `import torch` now raises ImportError
        try:
            import torch
        except ImportError:
            pass
        else:
            raise SystemExit("torch is still importable")
        import minipar.plan.formulas, minipar.plan.flops, minipar.plan.costmodel
        from minipar.plan.costmodel import cli, hardware, memory, search, table4, time, wire
        from minipar.plan.config import ModelConfig, ParallelConfig
        rows = minipar.plan.costmodel.table4()
        e = minipar.plan.costmodel.estimate(ModelConfig.preset("tiny"),
                                       ParallelConfig(pp=3, virtual_stages=3, schedule="interleaved"),
                                       seq_len=32, global_batch=6)
        assert minipar.plan.costmodel.main(["--json"]) == 0
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert sys.modules["torch"] is None and loaded == ["torch"], loaded
        print("no torch", round(100 * rows[0][1].mfu, 1), e.microbatches)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    from minipar.plan import costmodel
    assert r.stdout.strip().splitlines()[-1] == f"no torch {round(100 * costmodel.table4()[0][1].mfu, 1)} 6"


def test_python_m_costmodel_runs_from_the_package(repo_root):
    r = subprocess.run([sys.executable, "-m", "minipar.costmodel", "--json", "--tp", "8"],
                       cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "" and '"mfu"' in r.stdout


# ------------------------------------------------------------------ (b) one stage split
def test_the_costmodel_indexerror_layout_gets_the_executors_split():
    # 8 layers on pp=3 x v=3 = 9 stages: the cost model's own split used to return 8 counts
    # for 9 stages (IndexError). Now it is `split_layers` with Llama 3's lighter ends.
    pc = ParallelConfig(pp=3, virtual_stages=3, schedule="interleaved")
    e = cm.estimate(TINY, pc, seq_len=32, global_batch=6)
    assert 0 < e.mfu < 1 and e.microbatches == 6
    split = split_layers(TINY.n_layers, 9, first_last_lighter=1)
    assert [len(r) for r in split] == [0, 2, 1, 1, 1, 1, 1, 1, 0]
    assert stage_layer_counts(TINY.n_layers, 9) == [len(r) for r in split]
    held = [cm.rank_layers(TINY, 3, 3, r) for r in range(3)]
    assert held == [sum(len(split[c * 3 + r]) for c in range(3)) for r in range(3)] == [2, 4, 2]


def test_the_executor_and_the_cost_model_share_one_split():
    from minipar.trainer.parallel import pipeline

    assert pipeline.split_layers is split_layers         # what the executor calls
    for n_layers in range(1, 20):
        for n_stages in range(1, n_layers + 1):                   # every layout the executor runs
            want = [len(r) for r in split_layers(n_layers, n_stages)]
            assert cm.stage_layer_counts(n_layers, n_stages) == want
        for extra in (1, 2):                                      # the end stages hold no layer
            if n_layers + extra < 3:                              # (with a middle stage at least)
                continue
            counts = cm.stage_layer_counts(n_layers, n_layers + extra)
            assert sum(counts) == n_layers and len(counts) == n_layers + extra
            assert counts[0] == 0 and min(counts[1:-1], default=1) >= 1
        with pytest.raises(ConfigError):
            cm.stage_layer_counts(n_layers, n_layers + 3)


# ------------------------------------------------------------------ (c) equal to what they replaced
def _old_tp_breakdown(cfg, b, s, t, sp, layers, first, last, act_bytes=4, param_bytes=4):
    # parallel/tensor.py's formula before the move (valid when t divides dim)
    if t == 1:
        return dict.fromkeys(("layers", "embedding", "head", "loss", "norms"), 0)
    A = b * s * cfg.dim * act_bytes

    def ring(nbytes):
        return (t - 1) * nbytes // t
    return {"layers": layers * 8 * ring(A), "embedding": 2 * ring(A) if first else 0,
            "head": 2 * ring(A) if last else 0, "loss": 3 * 2 * ring(b * s * 4) if last else 0,
            "norms": (2 * layers + last) * 2 * ring(cfg.dim * param_bytes) if sp else 0}


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_tp_bytes_equal_the_tensor_parallel_files_old_formula(t, sp):
    for b, s in ((1, 32), (2, 16), (4, 64)):               # b*s*4 divisible by t, as in a run
        for layers, first, last in ((8, True, True), (3, True, False), (2, False, False), (3, False, True)):
            got = tp_wire_bytes_breakdown(TINY, b, s, t, sp, n_micro=1, layers=layers,
                                                   first=first, last=last)
            assert got == _old_tp_breakdown(TINY, b, s, t, sp, layers, first, last)


def test_cp_bytes_equal_the_context_parallel_files_old_formula():
    for cp in (1, 2, 4):
        for impl, hops in (("ring", 3 * (cp - 1)), ("allgather", 2 * (cp - 1))):
            assert cp_hops(cp, impl) == hops
            for tp in (1, 2):
                block = 2 * 2 * (64 // cp) * (TINY.n_kv_heads // tp) * TINY.head_dim * 4
                assert cp_wire_bytes_per_step(TINY, 2, 64, cp, impl, 3, tp) == 3 * 8 * hops * block
    with pytest.raises(ValueError, match="--cp-impl 'tree'"):
        cp_hops(2, "tree")


@pytest.mark.parametrize("name", ["afab", "1f1b", "interleaved", "zb"])
def test_one_bubble_for_the_schedules_and_the_cost_model(name):
    assert bubble_fraction is cm.bubble_fraction
    for p in (1, 2, 4, 8):
        for m in (1, 4, 8, 32):
            v = 2 if name == "interleaved" else 1
            if name == "zb":      # F, B, W equally long: the slot is a third of a micro-batch
                want = (p - 1) / (3 * m + p - 1)
                # the pipeline chapter's general form, with other pass times
                t_f, t_b, t_w = 1.0, 2.0, 0.5
                slot = t_f + t_b - t_w
                other = (p - 1) * slot / (m * (t_f + t_b + t_w) + (p - 1) * slot)
                assert bubble_fraction(name, p, m, 1, t_f, t_b, t_w) == pytest.approx(other)
            else:
                want = (p - 1) / (v * m + p - 1)
            assert bubble_fraction(name, p, m, v) == pytest.approx(want, abs=1e-15)


def test_bubble_matches_the_simulator_with_equal_passes():
    from minipar.plan.schedules import make_schedule, simulate

    for name, v in (("afab", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)):
        tl = simulate(make_schedule(name, 4, 8, v), 1.0, 1.0, 1.0)
        assert tl.bubble_fraction == pytest.approx(bubble_fraction(name, 4, 8, v))


def test_wire_bytes_is_the_cost_models_ring_bytes_and_commlogs():
    assert cm.ring_bytes is wire_bytes
    assert wire_bytes("all_reduce", 4, 1000) == 1500
    assert wire_bytes("reduce_scatter", 4, 1000) == wire_bytes("all_to_all", 4, 1000) == 750
    assert wire_bytes("send", 4, 1000) == 1000 and wire_bytes("recv", 4, 1000) == 0
    assert wire_bytes("broadcast", 4, 1000) == 750 and wire_bytes("all_reduce", 1, 9) == 0
    with pytest.raises(ValueError, match="unknown collective"):
        wire_bytes("gossip", 4, 1000)
    comm = pytest.importorskip("minipar.trainer.comm")
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv"):
        for n in (1, 2, 3, 8):
            for size in (0, 1000, 4097):
                assert comm.wire_bytes(op, n, size) == wire_bytes(op, n, size)


def test_param_counts_are_flops_and_add_up_per_rank():
    assert flops.param_count is param_count
    assert flops.layer_param_count is layer_param_count
    whole = sum(local_param_count(TINY, 1, n, r == 0, r == 3)
                for r, n in enumerate(stage_layer_counts(TINY.n_layers, 4)))
    assert whole == param_count(TINY)


def test_zero_memory_is_one_rule():
    # the data-parallel chapter's bytes per parameter and the cost model's memory agree
    work = cm.Workload(seq_len=64, global_batch=8)
    n_params = param_count(TINY)
    for stage in range(4):
        per = zero_bytes_per_param(stage, 4, param=4, grad=4, optimizer=8)
        mem = cm.memory_per_gpu(TINY, ParallelConfig(dp=4, zero=stage, microbatches=2), work, cm.FP32)
        for part in ("params", "grads", "optimizer"):
            assert mem[part] == pytest.approx(n_params * per[part])
    assert zero_bytes_per_param(0, 8) == {"params": 2, "grads": 2, "optimizer": 12}
    assert zero_bytes_per_param(3, 8) == {"params": 0.25, "grads": 0.25, "optimizer": 1.5}


def test_all_reduce_time_is_the_alpha_beta_model():
    assert all_reduce_time(1e6, 1, 1e-5, 1e9) == 0.0
    assert all_reduce_time(1e6, 4, 1e-5, 1e9) == pytest.approx(6e-5 + 1.5e-3)


def test_table4_is_unchanged_by_the_move():
    # the formulas moved, the predictions did not drift: Table 4 as `table4` computes it is
    # the evaluation's first three rows (the CSV's, read by `calibration`)
    from minipar.plan.costmodel.evaluate import residuals
    recorded = residuals(cm.published_runs()[:3])
    for (row, e), r in zip(cm.table4(), recorded):
        assert 100 * (e.mfu - row.mfu) == pytest.approx(r, abs=0.01)
    e = cm.table4()[0][1]
    assert cm.wire_seconds(e, "tp", cm.LLAMA3_CLUSTER) > 0 and cm.wire_seconds(e, "cp", cm.LLAMA3_CLUSTER) == 0
