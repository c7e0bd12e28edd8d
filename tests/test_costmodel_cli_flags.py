"""The cost model's flags that published runs need (issue 39, item 5): --mlp,
--tied-embeddings, --tp-comm-overlap, --recompute-layers, --layers-per-virtual-stage,
`plan --framework`, and the torchtitan profile. Each flag reaches the estimate; each bad
value is one line naming the flag, exit 2. Pure functions: milliseconds."""
from __future__ import annotations

import json

import pytest

from minipar.plan import costmodel as cm
from minipar.plan import flops
from minipar.plan.config import ModelConfig, ParallelConfig
from minipar.plan.costmodel.cli import build_parser, config_from_args
from minipar.plan.costmodel.frameworks import FRAMEWORKS, TORCHTITAN, apply

L70 = ModelConfig.preset("llama3-70b")


def run_json(capsys, argv) -> dict:
    assert cm.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def parsed(argv):
    """(model, cluster, layout, workload) as the CLI builds them."""
    return config_from_args(build_parser().parse_args(argv))


def exit_code(argv) -> int:
    try:
        return cm.main(argv)
    except SystemExit as e:          # argparse's own errors exit from inside parse_args
        return e.code


# ------------------------------------------------------------------ model flags
def test_mlp_gelu_has_two_matrices_fewer_parameters_and_flops(capsys):
    model = parsed(["--preset", "llama3-70b", "--mlp", "gelu"])[0]
    assert (model.mlp, model.mlp_matrices, model.name) == ("gelu", 2, "custom")
    one_matrix = L70.n_layers * L70.dim * L70.ffn_dim            # the gate, in every layer
    assert flops.param_count(model) == flops.param_count(L70) - one_matrix
    assert flops.flops_per_token(model, 8192) == pytest.approx(
        flops.flops_per_token(L70, 8192) - 6 * one_matrix)
    base = run_json(capsys, ["--preset", "llama3-70b"])
    gelu = run_json(capsys, ["--preset", "llama3-70b", "--mlp", "gelu"])
    assert gelu["memory_breakdown_gb"]["params"] < base["memory_breakdown_gb"]["params"]
    assert gelu["time_breakdown_s"]["compute"] < base["time_breakdown_s"]["compute"]
    assert parsed(["--preset", "llama3-70b", "--mlp", "relu2"])[0].mlp_matrices == 2


def test_tied_embeddings_drop_one_table_and_untie_a_preset():
    model = parsed(["--preset", "llama3-8b", "--tied-embeddings"])[0]
    base = ModelConfig.preset("llama3-8b")
    assert model.tie_embeddings and model.name == "custom"
    assert flops.param_count(model) == flops.param_count(base) - base.vocab_size * base.dim
    untied = parsed(["--preset", "llama3.2-1b", "--no-tied-embeddings"])[0]
    assert not untied.tie_embeddings
    assert parsed(["--preset", "llama3.2-1b"])[0].tie_embeddings       # the preset's own


# ------------------------------------------------------------------ the stack
def test_tp_comm_overlap_overrides_the_frameworks_choice(capsys):
    args = ["--preset", "llama3-70b", "--pp", "4"]
    own = run_json(capsys, [*args, "--framework", "megatron"])
    off = run_json(capsys, [*args, "--framework", "megatron", "--tp-comm-overlap", "off"])
    assert own["parallel"]["tp_overlap"] and not off["parallel"]["tp_overlap"]
    assert off["time_breakdown_s"]["tp"] > own["time_breakdown_s"]["tp"]
    assert off["mfu"] < own["mfu"]
    titan = run_json(capsys, [*args, "--framework", "torchtitan"])
    on = run_json(capsys, [*args, "--framework", "torchtitan", "--tp-comm-overlap", "on"])
    assert not titan["parallel"]["tp_overlap"] and on["parallel"]["tp_overlap"]
    assert on["time_breakdown_s"]["tp"] < titan["time_breakdown_s"]["tp"]
    # without a framework it is --tp-overlap's switch
    plain = run_json(capsys, ["--preset", "tiny", "--tp", "2", "--pp", "1", "--dp", "1",
                              "--seq-len", "64", "--global-batch", "4", "--tp-comm-overlap", "on"])
    assert plain["parallel"]["tp_overlap"]


def test_torchtitan_profile_cites_its_source_for_every_behaviour():
    assert FRAMEWORKS["torchtitan"] is TORCHTITAN
    for behaviour in ("reduce_bytes", "bucket", "zero", "zero_with_pp", "tp_overlap", "kernels"):
        assert TORCHTITAN.sources[behaviour], behaviour
    assert TORCHTITAN.kernels.attention == "flash2"          # SDPA, FLASH_ATTENTION first on H100
    pc = ParallelConfig(tp=8, pp=1, dp=8, sp=True)
    flat, precision, _ = apply(TORCHTITAN, L70, pc)
    assert (flat.zero, precision.reduce_bytes, flat.tp_overlap) == (3, 4, False)
    piped, _, _ = apply(TORCHTITAN, L70, pc.replace(pp=4))
    assert piped.zero == 1                                   # no resharding under PP
    assert apply(TORCHTITAN, L70, pc, tp_overlap=True)[0].tp_overlap


# ------------------------------------------------------------------ recomputation
def test_recompute_layers_sit_between_none_and_full(capsys):
    args = ["--preset", "llama3-70b", "--pp", "4", "--schedule", "1f1b", "--framework", "megatron"]
    none, part, full = (run_json(capsys, [*args, *extra]) for extra in
                        ([], ["--recompute-layers", "10"], ["--recompute", "full"]))
    assert part["workload"]["recompute_layers"] == 10 and part["workload"]["recompute"] == "full"
    assert none["step_time_s"] < part["step_time_s"] < full["step_time_s"]
    acts = [e["memory_breakdown_gb"]["activations"] for e in (none, part, full)]
    assert acts[0] > acts[1] > acts[2]
    # HFU counts the recomputed forward of half the layers: above MFU, below full's excess
    assert part["hfu"] > part["mfu"]
    assert part["hfu"] - part["mfu"] < full["hfu"] - full["mfu"]
    # Megatron's spelling, --recompute full --recompute-layers N, is the same run
    same = run_json(capsys, [*args, "--recompute", "full", "--recompute-layers", "10"])
    assert same["step_time_s"] == part["step_time_s"]
    # every layer of the stage is full recomputation; 0 is none
    all20 = run_json(capsys, [*args, "--recompute-layers", "20"])
    assert all20["step_time_s"] == pytest.approx(full["step_time_s"])
    assert all20["memory_breakdown_gb"]["activations"] == pytest.approx(acts[2])
    zero = run_json(capsys, [*args, "--recompute-layers", "0"])
    assert zero["step_time_s"] == none["step_time_s"]


def test_recompute_layers_count_per_model_chunk():
    """Megatron's block method counts the layers of each model chunk (`recompute.py`: the
    first N of the block's own layers): with v chunks, v x N of the rank's layers."""
    work = parsed(["--preset", "llama3-70b", "--pp", "4", "--virtual-stages", "2",
                   "--recompute-layers", "3"])[3]
    assert work.recomputed_layers([10, 10]) == 6
    assert work.recomputed_layers([2, 10]) == 5


# ------------------------------------------------------------------ virtual stages
def test_layers_per_virtual_stage_sets_the_chunks(capsys):
    _, _, pc, _ = parsed(["--preset", "llama3-70b", "--pp", "4", "--layers-per-virtual-stage", "2"])
    assert (pc.virtual_stages, pc.schedule) == (10, "interleaved")
    e = run_json(capsys, ["--preset", "llama3-70b", "--pp", "4", "--layers-per-virtual-stage", "2"])
    assert e["parallel"]["virtual_stages"] == 10
    one = parsed(["--preset", "llama3-70b", "--pp", "4", "--layers-per-virtual-stage", "20"])[2]
    assert one.virtual_stages == 1


# ------------------------------------------------------------------ the planner
def test_plan_under_a_framework(capsys):
    argv = ["plan", "--preset", "llama3-8b", "--gpus", "64", "--top", "20"]
    assert cm.main([*argv, "--framework", "torchtitan"]) == 0
    out = capsys.readouterr().out
    assert "every layout under torchtitan" in out
    ranked = [line for line in out.splitlines() if line[:1].isdigit() and ". TP" in line]
    assert ranked
    for line in ranked:                      # torchtitan's ZeRO, not the cheapest that fits
        assert ("ZeRO-1" in line) if " PP1 " not in line else ("ZeRO-3" in line), line
    plan = cm.planner.plan(ModelConfig.preset("llama3-8b"), cm.LLAMA3_CLUSTER, 64,
                           framework="megatron", tp_overlap=None, top=None)
    assert plan.ranked and all(e.parallel.zero == 1 for e in plan.ranked)
    assert all(e.parallel.tp_overlap == (e.parallel.tp > 1) for e in plan.ranked)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("argv,flag", [
    (["--mlp", "swish"], "--mlp"),
    (["--tied-embeddings=yes"], "--tied-embeddings"),
    (["--tp-comm-overlap", "maybe"], "--tp-comm-overlap"),
    (["--tp-comm-overlap", "on", "--tp", "1", "--pp", "1", "--dp", "1", "--global-batch", "8"],
     "--tp-comm-overlap on needs sequence parallelism"),
    (["--tp-comm-overlap", "off", "--tp-overlap"], "--tp-comm-overlap off"),
    (["--recompute-layers", "-1"], "--recompute-layers -1 must be >= 0"),
    (["--recompute-layers", "two"], "--recompute-layers"),
    (["--recompute-layers", "9"], "--recompute-layers 9 must be in [0, 8]"),      # 126 / pp 16
    (["--preset", "llama3-70b", "--pp", "4", "--recompute-layers", "21"], "--recompute-layers 21"),
    (["--recompute", "selective", "--recompute-layers", "2"], "--recompute-layers 2"),
    (["--layers-per-virtual-stage", "0"], "--layers-per-virtual-stage 0 must be a positive integer"),
    (["--layers-per-virtual-stage", "2", "--virtual-stages", "4"], "--layers-per-virtual-stage"),
    (["--preset", "llama3-70b", "--pp", "4", "--layers-per-virtual-stage", "3"],
     "--layers-per-virtual-stage 3 must divide the 20 layers"),
    (["--preset", "llama3-70b", "--pp", "3", "--layers-per-virtual-stage", "2"],
     "--layers-per-virtual-stage 2 needs the 80 layers divisible by --pp 3"),
    (["--preset", "llama3-70b", "--pp", "1", "--layers-per-virtual-stage", "2"],
     "--layers-per-virtual-stage 2 needs --pp > 1"),
    (["--preset", "llama3-70b", "--pp", "4", "--layers-per-virtual-stage", "2", "--schedule", "1f1b"],
     "--layers-per-virtual-stage 2 makes 10 chunks"),
    (["plan", "--gpus", "64", "--framework", "jax"], "--framework"),
    (["plan", "--gpus", "64", "--tp-comm-overlap", "x"], "--tp-comm-overlap"),
    (["plan", "--gpus", "64", "--tp-comm-overlap", "off", "--tp-overlap"], "--tp-comm-overlap off"),
    (["plan", "--gpus", "64", "--mlp", "silu"], "--mlp"),
])
def test_each_bad_value_is_one_line_naming_the_flag(capsys, argv, flag):
    code = exit_code(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert flag in err and "Traceback" not in err, err
