"""Expert parallelism is the single-device mixture of experts: the same losses and gradients
on real gloo worlds for EP alone and with TP (and SP), PP, DP/ZeRO, CP and all five axes at
once; a router forced to send everything to one expert and nothing to others; capacity
dropping that drops what the reference drops; checkpoints that reshard across EP degrees;
the all-to-all's bytes on the wire equal to the formula; the command line."""
import dataclasses
import json
import math

import pytest
import torch
import torch.distributed as dist

from helpers import capture_placed_grads, cut, losses, max_rel_diff
from minipar.plan.config import ConfigError, ModelConfig, ParallelConfig, TrainConfig
from minipar.plan.formulas.collectives import wire_bytes as ring_wire_bytes
from minipar.plan.formulas.experts import all_to_all_wire_bytes
from minipar.runtime import launch, wire_meter
from minipar.runtime.run import main, train
from minipar.trainer import comm
from minipar.trainer.grid import ProcessGrid
from minipar.trainer.model import MoE, Transformer, cross_entropy_sum
from minipar.trainer.parallelize import parallelize
from minipar.trainer.placement import local_index, placements
from minipar.trainer.step import Trainer

# 8 experts, 2 per token, one shared, the routing bias moving fast enough to change routes
# within the run, and the balance loss on: every part of the block is exercised
MOE = dict(moe_experts=8, moe_top_k=2, moe_shared_experts=1, moe_bias_rate=0.02)
AUX = dict(MOE, moe_aux_loss=0.01)
STEPS = 4


def run(steps=STEPS, **kw) -> dict:
    train_keys = {k: kw.pop(k) for k in list(kw) if k in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(parallel=ParallelConfig(**kw), steps=steps, progress=False, **train_keys)
    return train(cfg, after_backward=capture_placed_grads)


@pytest.fixture(scope="module")
def reference():
    """The single-device runs: with the balance loss, and without it (for CP)."""
    return {"aux": run(**AUX), "plain": run(**MOE)}


def assert_same_as(ref: dict, out: dict, rtol=1e-5):
    """Losses within rtol; every rank's step-0 gradients the reference's slice of them; and
    the routing bias of every step the reference's (the loads, integers, summed exactly)."""
    d = max_rel_diff(losses(out), losses(ref))
    assert d <= rtol, f"losses differ by {d:.2e}"
    want = ref["probes"][0]["grads"]
    for r, result in enumerate(out["all"]):
        got = result["probes"][0]["grads"]
        for name, (g, cuts) in got.items():
            torch.testing.assert_close(g, cut(want[name][0], cuts), rtol=1e-4, atol=2e-7,
                                       msg=lambda m: f"rank {r} {name}: {m}")
        for step, probe in result["probes"].items():
            for name, bias in probe["bias"].items():
                assert torch.equal(bias, ref["probes"][step]["bias"][name]), (r, step, name)


LAYOUTS = {
    "ep2": ("aux", dict(ep=2, dp=2)),
    "ep2_tp2_sp_zero2": ("aux", dict(ep=2, dp=2, tp=2, sp=True, zero=2)),
    "ep2_pp2_zero1": ("aux", dict(ep=2, dp=2, pp=2, zero=1)),
    "ep2_cp2": ("plain", dict(ep=2, cp=2)),
    "5d_tp2_cp2_pp2_dp2_ep4": ("plain", dict(tp=2, cp=2, pp=2, dp=2, ep=4, zero=1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_trains_as_the_single_device_moe(name, reference):
    which, layout = LAYOUTS[name]
    out = run(**(AUX if which == "aux" else MOE), **layout)
    assert_same_as(reference[which], out)
    ep = out["records"][0]["comm"]["ep"]["all_to_all"]
    assert ep["calls"] > 0 and ep["wire_bytes"] > 0


def test_the_bias_moves_and_the_experts_are_split(reference):
    ref = reference["aux"]
    last = ref["probes"][STEPS - 1]["bias"]
    assert any(b.abs().sum() > 0 for b in last.values())    # balancing acted
    out = ref["probes"][0]["grads"]
    assert out["layers.0.mlp.experts.gate_proj"][0].shape[0] == 8


# ---------------------------------------------------------------- the wire, in a step
@pytest.fixture(scope="module")
def wire_step():
    with wire_meter.steps_by_axis(Trainer):
        return train(TrainConfig(parallel=ParallelConfig(ep=2, dp=2), steps=1, progress=False,
                                 **MOE))["records"][-1]


@pytest.mark.slow
def test_a_steps_all_to_alls_on_the_wire_are_the_formulas(wire_step):
    """Measured by the kernel's write counter: what each all-to-all's caller computed with
    `all_to_all_wire_bytes`, within gloo's headers; CommLog counted the same bytes."""
    st = wire_step["wire_ops"]["ep"]["all_to_all"]
    assert 0 <= st["measured"] - st["gloo"] <= st["calls"] * wire_meter.HEADER_BYTES
    assert st["gloo"] == wire_step["comm"]["ep"]["all_to_all"]["wire_bytes"]


# ---------------------------------------------------------------- one world, many checks
def imbalanced(model, hot=0, empty=(5, 6, 7)):
    """Every token's first choice `hot`, none ever `empty`: a bias no score overcomes."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.expert_bias.zero_()
            m.expert_bias[hot] = 2.0
            m.expert_bias[list(empty)] = -2.0


def counts_seen(model) -> list:
    """The per-expert counts each MoE layer hands its experts, appended as they run."""
    seen = []
    for m in model.modules():
        if isinstance(m, MoE):
            m.experts.register_forward_pre_hook(lambda mod, args: seen.append(args[1].clone()))
    return seen


def _imbalanced_step(mcfg: ModelConfig, grid: ProcessGrid) -> dict:
    """One forward and backward of a 4-rank EP group (one rank's 2 sequences each) against the
    reference on all 8: the loss, the gradients (each rank's slice), the counts the experts
    were handed on this rank's rows, the reference's too."""
    ref, pcfg = Transformer(mcfg, seed=0), ParallelConfig(dp=4, ep=4)
    model = parallelize(mcfg, pcfg, grid, seed=0)
    imbalanced(ref), imbalanced(model.chunks[0])
    batch = torch.randint(0, mcfg.vocab_size, (8, 17), generator=torch.Generator().manual_seed(1))
    x, y, rows = batch[:, :-1], batch[:, 1:], slice(2 * grid.rank, 2 * grid.rank + 2)
    n = y.numel()
    ref_seen, seen = counts_seen(ref), counts_seen(model.chunks[0])
    with torch.no_grad():
        ref(x[rows])                                   # what the reference hands its experts
    mine = list(ref_seen)
    ref_loss = cross_entropy_sum(ref(x), y) / n
    ref_loss.backward()
    model.dp.start_step()
    loss = cross_entropy_sum(model.chunks[0](x[rows]), y[rows]) / n
    loss.backward()
    model.dp.finish_backward()
    with comm.paused():
        total = comm.all_reduce(loss.detach().clone(), grid.world).item()
    wrong = [name for name, p in model.chunks[0].named_parameters()
             if not torch.allclose(p.grad, _slice_of(ref.get_parameter(name).grad, p, grid),
                                   rtol=1e-4, atol=2e-7)]
    return {"loss": total, "ref_loss": ref_loss.item(), "wrong": wrong,
            "seen": [c.tolist() for c in seen], "ref_seen": [c.tolist() for c in mine],
            "ref_all": [c.tolist() for c in ref_seen[len(mine):]]}


def _slice_of(full, p, grid):
    return full[local_index(full.shape, placements(p), grid.axes)]


def _wire(grid: ProcessGrid) -> dict:
    """An uneven exchange: rank r sends (r+1)(j+1) rows of 4096 floats, each holding r, to
    rank j. Measured on the wire, and what arrived."""
    axis, r = grid.ep, grid.ep.rank
    send = [(r + 1) * (j + 1) for j in range(axis.size)]
    recv = [(j + 1) * (r + 1) for j in range(axis.size)]
    x = torch.full((sum(send), 4096), float(r))
    dist.barrier()
    got = {}
    measured = wire_meter.measure(
        lambda: got.setdefault("y", comm.all_to_all_uneven(x, axis, send, recv)))
    senders = [int(v) for v in got["y"][:, 0].tolist()]
    return {"measured": measured, "formula": all_to_all_wire_bytes(send, r, 4096 * 4),
            "ring": ring_wire_bytes("all_to_all", axis.size, x.numel() * 4),
            "arrived_from": senders, "expected_from": [j for j in range(4) for _ in range(recv[j])]}


def _world() -> dict:
    torch.set_num_threads(1)
    grid = ProcessGrid(dp=4, rank=dist.get_rank(), ep=4).init_groups()
    tiny = ModelConfig(n_layers=2, moe_experts=8, moe_top_k=2)
    return {"dropless": _imbalanced_step(tiny, grid),
            "capacity": _imbalanced_step(dataclasses.replace(tiny, moe_capacity_factor=1.0), grid),
            "wire": _wire(grid)}


@pytest.fixture(scope="module")
def world():
    return launch.run_local(_world, 4, backend="gloo")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dropless", "capacity"])
def test_a_forced_imbalanced_router_matches_the_reference(world, case):
    for r, out in enumerate(world):
        got = out[case]
        assert not got["wrong"], (r, got["wrong"])
        assert math.isclose(got["loss"], got["ref_loss"], rel_tol=1e-5)
        assert got["seen"] == got["ref_seen"], r       # the same copies kept, expert by expert
    layer0 = world[0][case]["ref_all"][0]               # the reference on all 8 sequences
    assert layer0[5:] == [0, 0, 0]                      # empty experts
    if case == "dropless":                              # one hot expert: every token's first
        assert layer0[0] == 8 * 16 and sum(layer0) == 8 * 16 * 2
    else:               # capacity ceil(C T k / E) = ceil(1 * 16 * 2 / 8) = 4 per sequence
        assert layer0[0] == 8 * 4 and sum(layer0) < 8 * 16 * 2


@pytest.mark.slow
def test_an_uneven_all_to_all_on_the_wire_is_the_formula(world):
    for r, out in enumerate(world):
        w = out["wire"]
        assert 0 <= w["measured"] - w["formula"] <= wire_meter.HEADER_BYTES, (r, w)
        assert w["arrived_from"] == w["expected_from"]
    # the ring formula (an even all-to-all's) is not what an uneven one sends
    assert any(abs(o["wire"]["measured"] - o["wire"]["ring"]) > wire_meter.HEADER_BYTES
               for o in world)


def test_capacity_keeps_the_earliest_positions():
    """All copies go to experts 0 and 1; each keeps the first ceil(C T k / E) positions of
    every sequence: later tokens get no routed output at all."""
    cfg = ModelConfig(moe_experts=8, moe_top_k=2, moe_capacity_factor=2.0)
    moe = MoE(cfg)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.02)
    moe.expert_bias[:2] = 2.0
    x = torch.randn(3, 16, cfg.dim)
    cap = math.ceil(2.0 * 16 * 2 / 8)
    out = moe(x)
    assert out[:, :cap].abs().sum(-1).gt(0).all()
    assert out[:, cap:].abs().sum() == 0


# ---------------------------------------------------------------- checkpoints reshard
@pytest.mark.slow
def test_a_checkpoint_saved_at_ep2_resumes_at_ep1_and_ep4(reference, tmp_path):
    ref = reference["plain"]
    run(steps=2, ep=2, dp=2, zero=1, save=str(tmp_path / "ck"), **MOE)
    for layout in (dict(), dict(ep=4, dp=2, cp=2)):
        out = run(resume=str(tmp_path / "ck"), **MOE, **layout)
        assert max_rel_diff(losses(out), losses(ref)) <= 1e-5, layout
        for r, result in enumerate(out["all"]):     # the routing bias came back with it
            for step, probe in result["probes"].items():
                for name, bias in probe["bias"].items():
                    assert torch.equal(bias, ref["probes"][step]["bias"][name]), (layout, r)


# ---------------------------------------------------------------- the command line
@pytest.mark.slow
def test_the_command_line_trains_to_the_single_device_losses(tmp_path):
    log = tmp_path / "log.jsonl"
    argv = ["--moe-experts", "8", "--moe-top-k", "2", "--steps", "5", "--no-progress"]
    assert main(argv + ["--ep", "2", "--dp", "2", "--log-json", str(log)]) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    ref = train(TrainConfig(steps=5, progress=False, moe_experts=8, moe_top_k=2))
    assert max_rel_diff([r["loss"] for r in rows], losses(ref)) <= 1e-5
    assert rows[0]["comm"]["ep"]["all_to_all"]["calls"] > 0


BAD = [
    (["--ep", "2", "--dp", "2"], "--ep 2 needs --moe-experts E > 0"),
    (["--moe-experts", "6", "--ep", "4", "--dp", "4"], "--ep 4 does not divide --moe-experts 6"),
    (["--moe-experts", "8", "--ep", "4", "--dp", "2"], "--ep 4 must divide dp*cp=2"),
    (["--moe-experts", "4", "--moe-top-k", "5"], "--moe-top-k 5 must be between 1 and"),
    (["--moe-experts", "4", "--moe-top-k", "0"], "--moe-top-k 0 must be between 1 and"),
    (["--moe-experts", "4", "--moe-capacity-factor", "-1"], "--moe-capacity-factor -1.0 must"),
    (["--moe-experts", "4", "--moe-capacity-factor", "nan"], "--moe-capacity-factor nan must be"),
    (["--moe-experts", "-2"], "--moe-experts -2 must be finite and >= 0"),
    (["--moe-experts", "8", "--ep", "2", "--dp", "2", "--zero", "3"], "--ep 2 does not combine"),
    (["--moe-experts", "8", "--cp", "2", "--moe-capacity-factor", "1"], "needs --cp 1"),
    (["--moe-experts", "8", "--ep", "0"], "--ep 0 must be a positive integer"),
    (["--moe-experts", "8", "--moe-shared-experts", "1", "--export-hf", "/tmp/x"],
     "a model with experts must be Mixtral's"),
    (["--moe-experts", "8", "--moe-bias-rate", "0.01", "--export-hf", "/tmp/x"],
     "which has no routing bias"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_expert_flags_exit_2_naming_the_rule(argv, message, capsys, no_rank_may_start):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_the_flags_replace_the_presets_fields_and_the_score_is_checked():
    cfg = TrainConfig(model="deepseek-v3", moe_experts=16, moe_top_k=4)
    m = cfg.model_config()
    assert (m.moe_experts, m.moe_top_k, m.moe_score, m.moe_first_layer) == (16, 4, "sigmoid", 3)
    with pytest.raises(ConfigError, match="moe_score='tanh' must be one of softmax, sigmoid"):
        ParallelConfig().validate(dataclasses.replace(m, moe_score="tanh"), 32, 8)
