"""Predicted = measured: the cost model's bytes per GPU (fp32, minipar's eager code) against
what the trainer measures on the fullest rank — parameters, gradients and optimizer state
to the byte, activations within 5% — on a grid of layouts, schedules and recompute modes."""
import contextlib
import io
import json

import pytest
import torch

from minipar.plan import costmodel as cm
from minipar.plan.config import ModelConfig, ParallelConfig
from minipar.plan.costmodel import cli as costmodel_cli
from minipar.plan.costmodel.memory import fullest_stage, memory_of_rank
from minipar.trainer.memory_meter import ActivationMeter
from test_recompute import WORLDS, with_modes
from variants import run_variants

TINY = ModelConfig.preset("tiny")
SEQ, BATCH = 32, 8                 # TrainConfig's defaults
STATES = ("params", "grads", "optimizer")

# every schedule with several micro-batch counts (interleaved needs a multiple of p)
SCHEDULES = (dict(pp=2), [dict(schedule=s, microbatches=m) for s in ("afab", "1f1b", "zb")
                          for m in (1, 2, 4)]
             + [dict(schedule="interleaved", virtual_stages=2, microbatches=m) for m in (2, 4)])
GRID = {**{name: (grid, with_modes(layouts)) for name, (grid, layouts) in WORLDS.items()},
        "pp2-schedules": SCHEDULES}


def workload(pc: ParallelConfig) -> cm.Workload:
    """The trainer's batch as the cost model reads it: micro-batches of global/(dp m) rows."""
    return cm.Workload(seq_len=SEQ, global_batch=BATCH,
                       microbatch_size=BATCH // (pc.dp * pc.microbatches), recompute=pc.recompute)


def pipeline_rank(rank: int, pc: ParallelConfig) -> int:
    return (rank // (pc.tp * pc.cp)) % pc.pp          # ranks are [TP, CP, PP, DP], TP fastest


def compare(grid: dict, variant: dict, measured: dict) -> float:
    """Assert the prediction for the measured rank; return the activations' relative error."""
    pc = ParallelConfig(**grid, **variant)
    stage = pipeline_rank(measured["rank"], pc)
    predicted = memory_of_rank(TINY, pc, workload(pc), cm.FP32, stage)
    for part in STATES:
        assert predicted[part] == measured[part], (grid, variant, part, predicted[part], measured[part])
    err = predicted["activations"] / measured["activations"] - 1
    assert abs(err) <= 0.05, (grid, variant, predicted["activations"], measured["activations"])
    # and the cost model names the same rank the fullest (or one whose total is as large)
    fullest = memory_of_rank(TINY, pc, workload(pc), cm.FP32, fullest_stage(TINY, pc, workload(pc), cm.FP32))
    assert fullest["total"] <= predicted["total"] * 1.05, (grid, variant, stage)
    return err


@pytest.mark.slow
@pytest.mark.parametrize("world", GRID)
def test_predicted_memory_equals_measured(world):
    grid, variants = GRID[world]
    results = run_variants(grid, variants)
    errors = [compare(grid, v, results[0][i]["memory"]) for i, v in enumerate(variants)]
    print(f"{world}: worst activation error {max(map(abs, errors)):.3%}")


@pytest.mark.slow
def test_pipeline_holds_its_schedules_micro_batches():
    """AFAB keeps every micro-batch: the whole batch's activations, however it is cut.
    1F1B keeps at most p = 2 of them: with m = 4 micro-batches of a quarter each, about half."""
    grid, variants = SCHEDULES
    acts = {(v["schedule"], v["microbatches"]): r["memory"]["activations"]
            for v, r in zip(variants, run_variants(grid, variants)[0])}
    assert acts["afab", 4] == pytest.approx(acts["afab", 1], rel=0.05)
    assert acts["1f1b", 4] < 0.6 * acts["afab", 4]


def test_costmodel_cli_json_matches_the_formula():
    args = ["--preset", "tiny", "--tp", "2", "--pp", "2", "--dp", "1", "--seq-len", str(SEQ),
            "--global-batch", str(BATCH), "--microbatch-size", "4", "--schedule", "1f1b",
            "--zero", "0", "--recompute", "selective", "--cp-impl", "ring", "--precision", "fp32",
            "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert costmodel_cli.main(args) == 0
    gb = json.loads(out.getvalue())["memory_breakdown_gb"]
    pc = ParallelConfig(tp=2, pp=2, sp=True, microbatches=2, recompute="selective")
    want = cm.memory_per_gpu(TINY, pc, workload(pc), cm.FP32)
    assert gb == pytest.approx({k: want[k] / 1e9 for k in (*STATES, "activations")})


def test_meter_counts_a_storage_once_and_sees_it_freed():
    x = torch.randn(8, 16, requires_grad=True)
    with ActivationMeter() as meter:
        y = x * x                     # saves x twice: one storage
        z = y.exp()                   # saves its output
        assert meter.current == x.nbytes + z.nbytes
        del y, z                      # graph freed without a backward: counts drop too
        assert meter.current == 0
    assert meter.peak == 2 * x.nbytes
