"""The cost model: bytes worked out by hand, closed-form bubbles, memory rules, Llama 3's
Table 4, a sanity law, and every error of the CLI. Pure functions: milliseconds."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minipar.plan import costmodel as cm
from minipar.plan import flops
from minipar.plan.formulas.context_parallel import cp_wire_bytes_per_step
from minipar.plan.formulas.tensor_parallel import tp_wire_bytes_per_step
from minipar.plan.config import (RECOMPUTE_MODES, ConfigError, ModelConfig, ParallelConfig,
                                 TrainConfig)

TINY = ModelConfig.preset("tiny")       # 8 layers, dim 64, 8 heads (4 KV, head_dim 8), ffn 128, vocab 256
L405 = ModelConfig.preset("llama3-405b")


# ------------------------------------------------------------------ bytes, by hand
def test_ring_bytes_agree_with_commlog():
    from minipar.trainer.comm import wire_bytes

    for op in ("all_reduce", "all_gather", "reduce_scatter", "send"):
        for n in (1, 2, 3, 8):
            for size in (0, 1000, 4097):
                assert cm.ring_bytes(op, n, size) == wire_bytes(op, n, size)


def test_dp_bytes_by_zero_stage():
    # 1000 float32 parameters over 4 ranks: G = P = 4000 bytes, (n-1)/n = 3/4
    assert cm.dp_bytes(1000, 4, zero=0) == 2 * 3 * 4000 // 4 == 6000         # all-reduce
    assert cm.dp_bytes(1000, 4, zero=1) == 3000 + 3000                        # RS + AG
    assert cm.dp_bytes(1000, 4, zero=2, microbatches=3) == 3 * 3000 + 3000    # RS per micro-batch
    assert cm.dp_bytes(1000, 4, zero=3, microbatches=2) == 2 * (2 * 3000 + 3000)
    # bf16 parameters, fp32 gradients (Llama 3): RS of 4 bytes, AG of 2 bytes per parameter
    assert cm.dp_bytes(1000, 4, zero=1, grad_bytes=4, param_bytes=2) == 3000 + 1500
    assert cm.dp_bytes(1000, 1, zero=1) == 0
    assert cm.zero_padded_numel([10, 3], 4) == 12 + 4
    with pytest.raises(ConfigError, match="--zero 4"):
        cm.dp_bytes(1000, 4, zero=4)


def test_tp_bytes_by_hand():
    # 8 tokens x dim 4 x 4 bytes = 128 bytes; all-reduce over 2 ranks puts 2 * 1/2 * 128 on the wire
    assert cm.tp_layer_bytes(8, 4, 2, 4) == 4 * 128
    assert cm.tp_layer_bytes(8, 4, 2, 4, recompute="full") == 6 * 128
    assert cm.tp_layer_bytes(8, 4, 1, 4) == 0
    assert cm.tp_embedding_bytes(8, 4, 2, 4) == 128
    assert cm.tp_embedding_bytes(8, 4, 2, 4, sp=True) == 64 + 64              # RS fwd, AG bwd
    assert cm.tp_norm_bytes(3, True, 4, 2, 4) == (2 * 3 + 1) * 16             # SP: norm grads
    assert cm.tp_head_bytes(8, 4, 2, 4) == 128
    assert cm.tp_cross_entropy_bytes(8, 2) == 3 * (8 * 4)                     # 3 x all-reduce of 8 floats
    # 4 ranks: the all-reduce factor is 2 * 3/4
    assert cm.tp_layer_bytes(8, 4, 4, 4) == 4 * 192


def test_pp_bytes_by_stage():
    # 10 tokens x dim 4 x 4 bytes = 160 bytes per send, 3 micro-batches, 4 stages
    assert cm.pp_bytes(10, 4, 4, 3, 4, stage=0) == 3 * 160                   # forward only
    assert cm.pp_bytes(10, 4, 4, 3, 4, stage=1) == 3 * 2 * 160               # both ways
    assert cm.pp_bytes(10, 4, 4, 3, 4, stage=3) == 3 * 160                   # backward only
    # 2 chunks per rank: rank 0 sends forward from both chunks, backward from chunk 1 only
    assert cm.pp_bytes(10, 4, 4, 3, 4, stage=0, virtual_stages=2) == 3 * 3 * 160
    assert cm.pp_bytes(10, 4, 4, 3, 4, stage=1, sp_tp=2) == 3 * 2 * 80       # SP: my 1/tp
    assert cm.pp_bytes(10, 4, 1, 3, 4) == 0


def test_cp_bytes_by_hand():
    kv = cm.cp_kv_bytes(32, 4, 8, 4)
    assert kv == 2 * 32 * 4 * 8 * 4 == 8192
    # ring over 4: forward 3 sends, backward 3 (K,V again) + 3 (dK,dV accumulators)
    assert cm.cp_layer_bytes(kv, 4, "ring") == (3 + 3 + 3) * kv
    # all-gather of 4 kv (3/4 of it on the wire) + reduce-scatter of 4 dkv
    assert cm.cp_layer_bytes(kv, 4, "allgather") == 3 * kv + 3 * kv
    assert cm.cp_layer_bytes(kv, 4, "allgather", recompute="full") == 2 * 3 * kv + 3 * kv
    assert cm.cp_layer_bytes(kv, 1, "ring") == 0


def test_comm_bytes_per_gpu_tiny_by_hand():
    # tiny, TP2 PP2, SP, float32, 8 sequences of 64 tokens, micro-batch 1 -> m = 8.
    pc = ParallelConfig(tp=2, pp=2, sp=True, microbatches=8)
    work = cm.Workload(seq_len=64, global_batch=8)
    got = cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32, stage=0)
    s = 64 * 64 * 4                       # one micro-batch's activations: 16384 bytes
    tp_layer = 4 * s                      # 4 all-reduces, each 2 * 1/2 * S
    embedding = s                         # SP: reduce-scatter fwd + all-gather bwd, 1/2 * S each
    norms = 2 * 4 * 64 * 4                # SP: 8 norm gradients of 64 floats, all-reduced once per step
    assert got["tp"] == 8 * (4 * tp_layer + embedding) + norms      # rank 0 holds 4 layers
    assert got["pp"] == 8 * (s // 2)                               # forward sends of my half
    assert got["cp"] == got["dp"] == 0
    last = cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32, stage=1)
    head = s                                                # SP: all-gather fwd + reduce-scatter bwd
    ce = 3 * 64 * 4                                         # 3 all-reduces of 64 floats over 2
    assert last["tp"] == 8 * (4 * tp_layer + head + ce) + norms + 64 * 4   # + the final norm


def test_dp_bytes_of_tiny_count_every_parameter():
    pc = ParallelConfig(dp=2, zero=0, microbatches=1)
    work = cm.Workload(seq_len=64, global_batch=2)
    got = cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32)
    assert got["dp"] == 2 * 1 * flops.param_count(TINY) * 4 // 2
    # CP ranks reduce gradients too: the group is dp x cp
    pc = ParallelConfig(dp=2, cp=2, zero=0, microbatches=1)
    got = cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32)
    assert got["dp"] == 2 * 3 * flops.param_count(TINY) * 4 // 4


def test_local_params_add_up_to_the_model():
    # the TP shards of every stage, put back together, are the whole model
    tp, pp = 2, 4
    counts = cm.stage_layer_counts(TINY.n_layers, pp)
    shards = sum(cm.local_param_count(TINY, tp, counts[r], r == 0, r == pp - 1) for r in range(pp))
    replicated_norms = 2 * TINY.dim * TINY.n_layers + TINY.dim
    assert tp * shards - (tp - 1) * replicated_norms == flops.param_count(TINY)


def test_stage_layer_counts():
    assert cm.stage_layer_counts(8, 4) == [2, 2, 2, 2]
    assert cm.stage_layer_counts(10, 4) == [3, 3, 2, 2]
    # Llama 3 405B: 16 ranks x 8 chunks = 128 stages for 126 layers + embedding + head
    assert cm.stage_layer_counts(126, 128) == [0] + [1] * 126 + [0]
    assert cm.rank_layers(L405, 16, 8, 0) == 7 and cm.rank_layers(L405, 16, 8, 1) == 8
    with pytest.raises(ConfigError):
        cm.stage_layer_counts(8, 11)


# ------------------------------------------------------------------ bubble and memory
@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2), (8, 16, 4), (2, 4, 1)])
def test_bubble_closed_forms(p, m, v):
    assert cm.bubble_fraction("1f1b", p, m) == (p - 1) / (m + p - 1)
    assert cm.bubble_fraction("afab", p, m) == (p - 1) / (m + p - 1)
    assert cm.bubble_fraction("interleaved", p, m, v) == (p - 1) / (v * m + p - 1)
    assert cm.bubble_fraction("zb", p, m) < cm.bubble_fraction("1f1b", p, m)
    assert cm.bubble_fraction("1f1b", 1, m) == 0


def test_bubble_matches_a_simulated_schedule():
    # The pipeline chapter's event simulator, where it exists, agrees with the closed form.
    sched = pytest.importorskip("minipar.plan.schedules")
    for name, p, m, v, times in [("1f1b", 4, 8, 1, (1, 2, 0)), ("interleaved", 4, 8, 2, (1, 2, 0)),
                                 ("zb", 4, 8, 1, (1, 1, 1))]:
        timeline = sched.simulate(sched.make_schedule(name, p, m, v), *times)
        assert timeline.bubble_fraction == pytest.approx(cm.bubble_fraction(name, p, m, v))


def test_in_flight_microbatches():
    assert cm.in_flight_microbatches("afab", 4, 8) == 8
    assert [cm.in_flight_microbatches("1f1b", 4, 8, r) for r in range(4)] == [4, 3, 2, 1]
    assert cm.in_flight_microbatches("1f1b", 4, 2) == 2            # never more than m
    # Megatron's interleaved rank 0: p (v-1) + 2 (p-1) + 1 chunks of 1/v each = p + (p-1)/v
    assert cm.in_flight_microbatches("interleaved", 16, 32, 0, 8) == pytest.approx(16 + 15 / 8)


def test_memory_by_zero_stage():
    work = cm.Workload(seq_len=64, global_batch=8)
    n_params = flops.param_count(TINY)
    mem = [cm.memory_per_gpu(TINY, ParallelConfig(dp=4, zero=z, microbatches=2), work, cm.FP32)
           for z in range(4)]
    assert mem[0]["params"] == 4 * n_params and mem[0]["grads"] == 4 * n_params
    assert mem[0]["optimizer"] == 8 * n_params                    # Adam's m and v
    assert mem[1]["optimizer"] == mem[0]["optimizer"] / 4 and mem[1]["grads"] == mem[0]["grads"]
    assert mem[2]["grads"] == mem[0]["grads"] / 4 and mem[2]["params"] == mem[0]["params"]
    assert mem[3]["params"] == mem[0]["params"] / 4
    assert len({m["activations"] for m in mem}) == 1               # ZeRO does not touch those


def test_activation_memory_by_recompute():
    # tiny, per token and layer, elements: none 4h + 2h + 2 kv + 3 ffn; selective 2h + h + 2 kv + 2 ffn
    h, kv, f = 64, 32, 128
    assert cm.activation_elements(TINY, 1, False, "none") == 4 * h + 2 * h + 2 * kv + 3 * f
    assert cm.activation_elements(TINY, 1, False, "selective") == 3 * h + 2 * kv + 2 * f
    assert cm.activation_elements(TINY, 1, False, "full") == h
    # TP splits the heads and the FFN; only SP splits the norms' h-wide tensors too
    assert cm.activation_elements(TINY, 2, False, "none") == 4 * h + (2 * h + 2 * kv + 3 * f) / 2
    assert cm.activation_elements(TINY, 2, True, "none") == cm.activation_elements(TINY, 1, False, "none") / 2


# ------------------------------------------------------------------ Llama 3's Table 4
def test_table4_from_the_physics_within_its_bounds():
    """Table 4 from measured kernels and the paper's own stack: each row within 4 points or
    its `UNEXPLAINED` bound (the residual is the finding); the 8K rows that miss are faster
    than Meta's runs, not slower."""
    for row, est in cm.table4():
        label = (f"llama3-405b {row.gpus} GPUs TP{row.tp} CP{row.cp} PP{row.pp} DP{row.dp} "
                 f"seq {row.seq_len}")
        gap = est.mfu - row.mfu
        assert abs(gap) <= UNEXPLAINED.get(label, 4.0) / 100, (row, est.mfu)
        assert label not in UNEXPLAINED or gap > 0


def test_table4_what_if_the_fabric_were_slower():
    """`table4(**changes)` is Table 4 with one efficiency changed; rows 1 and 2 are bound by
    the NIC, so their MFU rises with its bus bandwidth, and `nic_window` is exactly the swept
    rates at which both land within the tolerance (never the constant: that would be a fit)."""
    from minipar.plan.costmodel.constants import NIC_BUSBW_FRACTION
    from minipar.plan.costmodel.table4 import NIC_SWEEP, TOLERANCE, nic_sensitivity, nic_window
    base = [e.mfu for _, e in cm.table4()]
    assert [e.mfu for _, e in cm.table4(network_inter=NIC_BUSBW_FRACTION)] == base
    assert [e.mfu for _, e in cm.table4(attention="flash2")] != base
    sweep = nic_sensitivity()
    assert list(sweep) == list(NIC_SWEEP)
    for i in (0, 1):
        curve = [mfus[i] for mfus in sweep.values()]
        assert curve == sorted(curve) and curve[-1] - curve[0] > 0.05
    lo, hi = nic_window(sweep)

    def agree(f):
        return all(100 * abs(sweep[f][i] - cm.TABLE4[i].mfu) <= TOLERANCE for i in (0, 1))
    assert [f for f in NIC_SWEEP if agree(f)] == [f for f in NIC_SWEEP if lo <= f <= hi]
    assert lo < hi and NIC_SWEEP[0] < lo and hi < NIC_SWEEP[-1]
    assert nic_window(sweep, tolerance=0.1) is None


def test_table4_runs_the_papers_stack():
    # every row goes through frameworks.LLAMA3: FSDP units of one layer, fp32 reduce-scatter
    rows = cm.table4()
    unit = cm.frameworks.fsdp_unit_mb(L405, 8)
    assert [r.mfu for r, _ in rows] == [0.43, 0.41, 0.38]
    assert all(e.parallel.virtual_stages == 8 and e.workload.microbatch_size == 1 for _, e in rows)
    assert all(e.parallel.bucket_mb == unit and e.parallel.zero == 2 for _, e in rows)


def test_doubling_dp_at_fixed_global_batch_lowers_mfu():
    # rows 1 -> 2: the per-rank batch halves, so the bubble's share grows
    base = dict(tp=8, pp=16, zero=1, sp=True, schedule="interleaved", virtual_stages=8)
    e64 = cm.estimate(L405, ParallelConfig(dp=64, **base), seq_len=8192)
    e128 = cm.estimate(L405, ParallelConfig(dp=128, **base), seq_len=8192)
    assert e128.mfu < e64.mfu and e128.bubble_fraction > e64.bubble_fraction
    # and without a pipeline: the exposed tail of the gradient reduce-scatter is the same
    # number of seconds, in a step that gets shorter and shorter
    m8 = ModelConfig.preset("llama3-8b")
    prev = None
    for dp in (64, 128, 256, 512):
        e = cm.estimate(m8, ParallelConfig(dp=dp, zero=1), seq_len=8192, global_batch_tokens=2**22)
        assert e.time_breakdown_s["dp"] > 0
        if prev is not None:
            assert e.mfu < prev
        prev = e.mfu


def test_estimate_keys_and_consistency():
    e = cm.estimate(L405, cm.TABLE4[0].parallel(), seq_len=8192)
    d = e.as_dict()
    for key in ("mfu", "hfu", "tflops_per_gpu", "step_time_s", "memory_gb_per_gpu",
                "comm_bytes_per_gpu", "bubble_fraction"):
        assert key in d
    assert set(d["comm_bytes_per_gpu"]) == {"tp", "cp", "pp", "dp"}
    assert sum(e.time_breakdown_s.values()) == pytest.approx(e.step_time_s)
    model_flops = 2**24 * flops.flops_per_token(L405, 8192)
    assert e.mfu == pytest.approx(model_flops / (e.step_time_s * 8192 * 989.4e12))
    assert json.loads(json.dumps(d)) == d


def test_recompute_costs_time_and_saves_memory():
    pc = cm.TABLE4[0].parallel()
    runs = {r: cm.estimate(L405, pc, seq_len=8192, recompute=r) for r in RECOMPUTE_MODES}
    assert runs["none"].mfu > runs["selective"].mfu > runs["full"].mfu
    assert runs["full"].hfu > runs["full"].mfu
    assert runs["none"].memory_gb_per_gpu > runs["selective"].memory_gb_per_gpu > runs["full"].memory_gb_per_gpu


def test_pods_only_limit_rings_that_share_an_uplink():
    c = cm.LLAMA3_CLUSTER
    assert cm.group_bandwidth_GBps(c, 1, 8, 8192) == 450            # one server: NVLink
    assert cm.group_bandwidth_GBps(c, 8, 16, 8192) == 50            # 16 servers: the NIC
    # DP64 over 8192 GPUs: 128 rings share each pod's 3072 * 50 / 7 GB/s: still the NIC
    assert cm.group_bandwidth_GBps(c, 128, 64, 8192) == 50
    # DP2 of two 4096-GPU replicas: 4096 rings, every GPU of a pod sends across: NIC / 7
    assert cm.group_bandwidth_GBps(c, 4096, 2, 8192) == pytest.approx(50 / 7)


def test_estimate_rejects_bad_layouts():
    with pytest.raises(ConfigError, match="--tp 3 does not divide n_heads"):
        cm.estimate(L405, ParallelConfig(tp=3, pp=16, dp=64), seq_len=8192)
    with pytest.raises(ConfigError, match="--microbatch-size 3"):
        cm.estimate(L405, ParallelConfig(tp=8, pp=16, dp=64), seq_len=8192, microbatch_size=3)
    with pytest.raises(ConfigError, match="exclusive"):
        cm.estimate(L405, ParallelConfig(), seq_len=8192, global_batch=8, global_batch_tokens=8192 * 8)


def test_best_configs_are_valid_sorted_and_fit():
    m70 = ModelConfig.preset("llama3-70b")
    found = cm.best_configs(m70, gpus=512, seq_len=8192, global_batch_tokens=2**22,
                            microbatch_sizes=(1,), schedules=("1f1b",), recompute=("selective",), top=5)
    assert found and len(found) <= 5
    assert [e.mfu for e in found] == sorted((e.mfu for e in found), reverse=True)
    for e in found:
        assert e.fits_memory and e.parallel.world_size == 512


# ------------------------------------------------------------------ the CLI
def run_cli(capsys, *argv):
    code = cm.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_default_is_table4_row1(capsys):
    code, out, err = run_cli(capsys)
    assert code == 0 and err == ""
    assert "TP8 CP1 PP16 DP64" in out and "MFU" in out and "bubble" in out


def test_cli_json(capsys):
    code, out, _ = run_cli(capsys, "--json", "--gpus", "16384", "--cp", "16", "--dp", "8",
                           "--seq-len", "131072", "--global-batch-tokens", str(2**24))
    d = json.loads(out)
    assert code == 0 and 0.3 < d["mfu"] < 0.7
    assert d["comm_bytes_per_gpu"]["cp"] > 0
    assert "chose --framework llama3 (the preset's own stack)" in d["defaults_chosen"]


def test_cli_constants_lists_every_constant_with_a_source(capsys):
    code, out, _ = run_cli(capsys, "constants", "--json")
    rows = json.loads(out)
    assert code == 0 and {r["name"] for r in rows} == set(cm.all_constants())
    assert all(r["source"] and r["unit"] and isinstance(r["value"], (int, float)) for r in rows)
    assert not any("fitted to" in r["source"] and "MFU" in r["source"] for r in rows)


@pytest.mark.parametrize("name", ["llama3", "megatron", "nanotron", "deepspeed"])
def test_cli_framework_changes_the_stack(capsys, name):
    code, out, _ = run_cli(capsys, "--json", "--framework", name)
    d = json.loads(out)
    fw = cm.FRAMEWORKS[name]
    assert code == 0 and 0 < d["mfu"] < 1
    assert d["parallel"]["zero"] == (fw.zero if fw.zero is not None else 1)
    assert all(fw.sources[k] for k in ("reduce_bytes", "bucket", "zero", "tp_overlap", "kernels"))


def test_cli_own_model_and_hardware(capsys):
    code, out, _ = run_cli(capsys, "--json", "--layers", "8", "--dim", "64", "--ffn-dim", "128",
                           "--heads", "8", "--kv-heads", "4", "--vocab", "256",
                           "--peak-tflops", "0.05", "--hbm-gb", "16", "--gpus-per-node", "2",
                           "--intra-node-GBps", "10", "--inter-node-Gbps", "10",
                           "--tp", "2", "--cp", "1", "--pp", "2", "--dp", "1", "--seq-len", "64",
                           "--global-batch", "8", "--schedule", "1f1b", "--precision", "fp32")
    d = json.loads(out)
    assert code == 0 and d["parallel"]["tp"] == 2 and 0 < d["mfu"] < 1


@pytest.mark.parametrize("argv, names", [
    (["--preset", "nope"], "--preset"),
    (["--gpus", "100"], "--gpus 100"),
    (["--gpus", "8192", "--dp", "32"], "--gpus 8192 must equal"),
    (["--tp", "3"], "--tp 3 does not divide"),
    (["--dp", "0"], "--dp 0"),
    (["--seq-len", "0"], "--seq-len 0"),
    (["--global-batch-tokens", "1000"], "--global-batch-tokens 1000"),
    (["--global-batch", "8", "--global-batch-tokens", "65536"], "--global-batch"),
    (["--global-batch", "-8"], "--global-batch -8"),
    (["--microbatch-size", "3"], "--microbatch-size 3"),
    (["--microbatch-size", "0"], "--microbatch-size 0"),
    (["--schedule", "gpipe"], "--schedule"),
    (["--recompute", "some"], "--recompute"),
    (["--cp-impl", "tree"], "--cp-impl"),
    (["--zero", "5"], "--zero 5"),
    (["--cp", "3"], "--cp 3"),
    (["--virtual-stages", "4", "--schedule", "1f1b"], "--virtual-stages 4"),
    (["--virtual-stages", "16"], "--virtual-stages 16"),
    (["--heads", "7"], "n_heads=7"),
    (["--peak-tflops", "0"], "--peak-tflops"),
    (["--inter-node-Gbps", "-1"], "--inter-node-Gbps"),
    (["--tp", "two"], "--tp"),
    (["--framework", "jax"], "--framework"),
    (["--sp", "--tp", "1", "--pp", "1", "--dp", "1", "--global-batch", "8"], "--sp needs --tp > 1"),
    (["--schedule", "interleaved", "--pp", "16", "--global-batch", "8", "--dp", "1"], "--microbatches"),
])
def test_cli_errors(capsys, argv, names):
    try:
        code = cm.main(argv)
    except SystemExit as e:          # argparse's own errors exit from inside parse_args
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert names in err and "Traceback" not in err


def test_cli_layout_flags_are_the_trainers_with_the_cost_models_defaults():
    """One field, one flag, one help text: the layout flags come from ParallelConfig and
    TrainConfig; only their defaults are the cost model's (declared once, LAYOUT_DEFAULTS)."""
    import dataclasses
    from minipar.plan.config import TrainConfig
    from minipar.plan.costmodel.cli import LAYOUT_DEFAULTS
    text = " ".join(cm.build_parser().format_help().split())
    for cls, names in ((ParallelConfig, [f.name for f in dataclasses.fields(ParallelConfig)
                                         if f.name not in ("microbatches",
                                                           "consecutive_microbatches")]),
                       (TrainConfig, ["seq_len", "global_batch"])):
        for f in dataclasses.fields(cls):
            if f.name in names:
                assert "--" + f.name.replace("_", "-") in text and f.metadata["help"] in text, f.name
    args = cm.build_parser().parse_args([])
    assert (args.tp, args.pp, args.schedule, args.sp, args.zero, args.cp_impl, args.seq_len) == \
        (None, None, None, None, 1, "allgather", 8192)
    assert set(LAYOUT_DEFAULTS) <= set(vars(args))


def test_cli_as_a_module_exits_2_without_traceback(repo_root):
    r = subprocess.run([sys.executable, "-m", "minipar.costmodel", "--tp", "3"], cwd=repo_root,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().startswith("error: --tp 3") and "Traceback" not in r.stderr


# ------------------------------------------------------------------ the axes' own formulas
# Each axis's per-step byte count (the formula its CommLog is tested against, in
# minipar.plan.formulas) and the cost model's per-GPU assembly of the same pieces must agree.
@pytest.mark.parametrize("tp, sp, pp, stage", [(2, False, 1, 0), (2, True, 1, 0), (4, True, 2, 0),
                                               (4, True, 2, 1), (2, False, 4, 2)])
def test_tp_bytes_agree_with_the_tensor_parallel_module(tp, sp, pp, stage):
    work = cm.Workload(seq_len=64, global_batch=6)
    pc = ParallelConfig(tp=tp, sp=sp, pp=pp, microbatches=6)
    layers = cm.rank_layers(TINY, pp, 1, stage)
    want = tp_wire_bytes_per_step(TINY, 1, 64, tp, sp, n_micro=6, layers=layers,
                                           first=stage == 0, last=stage == pp - 1)
    assert cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32, stage)["tp"] == want


@pytest.mark.parametrize("impl, cp, tp", [("ring", 2, 1), ("ring", 4, 2), ("allgather", 4, 1),
                                          ("allgather", 2, 2)])
def test_cp_bytes_agree_with_the_context_parallel_module(impl, cp, tp):
    work = cm.Workload(seq_len=64, global_batch=3)
    pc = ParallelConfig(cp=cp, tp=tp, cp_impl=impl, microbatches=3)
    want = cp_wire_bytes_per_step(TINY, 1, 64, cp, impl, n_micro=3, tp=tp)
    assert cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32)["cp"] == want


# ------------------------------------------------------------------ measured by CommLog
@pytest.mark.slow
def test_measured_gloo_bytes_equal_the_prediction_per_axis():
    # One 8-rank world with every axis: TP2 (with SP) x CP2 (ring) x PP2 (interleaved, 2
    # chunks), ZeRO-1 over the dp x cp group. Rank 0's CommLog of a step against the model.
    run = pytest.importorskip("minipar.runtime.run")
    pc = ParallelConfig(tp=2, cp=2, pp=2, dp=1, zero=1, sp=True, microbatches=4,
                        schedule="interleaved", virtual_stages=2, cp_impl="ring")
    cfg = TrainConfig(parallel=pc, global_batch=8, seq_len=32, steps=2, progress=False,
                      peak_flops=1e10)
    record = run.train(cfg)["records"][-1]
    measured = {axis: sum(op["wire_bytes"] for op in ops.values())
                for axis, ops in record["comm"].items()}
    work = cm.Workload(seq_len=32, global_batch=8, microbatch_size=2)
    predicted = cm.comm_bytes_per_gpu(TINY, pc, work, cm.FP32, stage=0)
    for axis in ("tp", "cp", "pp", "dp"):
        assert measured[axis] == predicted[axis] > 0, axis


# ------------------------------------------------------------------ figures and explorer
def test_cost_model_figures_draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from minipar.teach import figures as viz, widgets

    rows = cm.table4()
    estimates = {f"row {i}": e for i, (_, e) in enumerate(rows)}
    figures = [viz.table4_figure(rows), viz.comm_volume_figure(estimates), viz.memory_figure(estimates),
               viz.network_figure(),
               viz.measured_vs_predicted_figure({"tp": {"all_reduce": {"wire_bytes": 10}}}, {"tp": 10}),
               widgets.static_whatif(), widgets.whatif_figure(tp=3)]
    assert all(isinstance(f, matplotlib.figure.Figure) for f in figures)
    # the invalid layout's panel names the broken rule
    texts = [t.get_text() for ax in figures[-1].axes for t in ax.texts]
    assert any("--tp 3 does not divide n_heads" in t for t in texts)
    plt.close("all")


def test_whatif_explorer_builds_and_redraws():
    pytest.importorskip("ipywidgets")
    import matplotlib
    matplotlib.use("Agg")
    from minipar.teach import widgets

    ui = widgets.whatif()
    sliders = ui.children[0].children[0].children
    sliders[0].value = 4                   # tp: redraws without error
    e, problems = widgets.whatif_estimate(tp=4)
    assert problems is None and e.parallel.tp == 4
    assert widgets.whatif_estimate(tp=3)[1]


# ------------------------------------------------------------------ issue 13: defaults, physics, fit
def _cli_flags(run):
    p, w = run.parallel, run.work
    argv = ["--tp", str(p.tp), "--cp", str(p.cp), "--pp", str(p.pp), "--dp", str(p.dp),
            "--seq-len", str(w.seq_len), "--global-batch", str(w.global_batch),
            "--microbatch-size", str(w.microbatch_size)]
    if run.model.name in cm.PLAYBOOK_MODELS:
        m = run.model
        argv += ["--gpu", "h100", "--layers", str(m.n_layers), "--dim", str(m.dim),
                 "--ffn-dim", str(m.ffn_dim), "--heads", str(m.n_heads),
                 "--kv-heads", str(m.n_kv_heads), "--vocab", str(m.vocab_size)]
    return argv


USER_STYLE = [
    ["--pp", "1"], ["--pp", "1", "--tp", "4", "--gpus", "32", "--global-batch", "64"],
    ["--preset", "llama3-8b", "--gpus", "8"], ["--model", "llama3-70b", "--gpu", "a100", "--gpus", "64"],
    ["--preset", "llama3-8b", "--gpus", "16", "--seq-len", "4096", "--global-batch", "256"],
    ["--gpu", "b200", "--tp-overlap"], ["--cp", "2", "--seq-len", "16384", "--gpus", "8192"],
    ["--pp", "4", "--gpus", "1024", "--global-batch", "1024"], ["--heads", "64", "--kv-heads", "8"],
    ["--gpu", "h200", "--hbm-gb", "100", "--pp", "8", "--gpus", "4096"],
    ["--schedule", "interleaved", "--pp", "1", "--dp", "8", "--global-batch", "64"],
]


@pytest.mark.parametrize("argv", [pytest.param(_cli_flags(r), id=r.label) for r in cm.published_runs()]
                         + [pytest.param(a, id=" ".join(a)) for a in USER_STYLE])
def test_user_style_invocations_are_not_refused(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "MFU" in out


@pytest.mark.parametrize("argv, passed", [
    (["--pp", "1", "--virtual-stages", "4"], "--virtual-stages"),
    (["--tp", "4", "--no-sp", "--tp-overlap"], "--no-sp"),
    (["--gpus", "100"], "--gpus 100"),
    (["--pp", "4", "--gpus", "1024", "--global-batch", "1000"], "--global-batch"),
])
def test_errors_name_only_flags_that_were_passed(capsys, argv, passed):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and passed in err
    for flag in ("--schedule", "--microbatches"):
        assert flag not in err or flag in argv


def test_defaults_say_what_they_chose(capsys):
    code, out, _ = run_cli(capsys, "--pp", "1", "--gpus", "1024")
    assert code == 0 and "chose --schedule 1f1b (no pipeline)" in out
    code, out, _ = run_cli(capsys, "--pp", "8", "--gpus", "1024")
    assert "chose --schedule interleaved" in out and "chose --virtual-stages 8" in out


def test_gpu_presets_and_overrides():
    b200 = cm.gpu_cluster("b200")
    assert b200.peak_tflops == 2250 and b200.hbm_TBps == 8.0
    assert cm.gpu_cluster("h100", hbm_gb=141).hbm_gb == 141
    assert set(cm.GPU_NAMES) >= {"h100", "h200", "a100", "b200"}
    with pytest.raises(ConfigError, match="--gpu 'v1' is unknown"):
        cm.gpu_cluster("v1")
    # the same step on a faster GPU takes less time
    pc = cm.TABLE4[0].parallel()
    slow = cm.estimate(L405, pc, cm.gpu_cluster("a100"), 8192)
    fast = cm.estimate(L405, pc, cm.gpu_cluster("h100"), 8192)
    assert fast.step_time_s < slow.step_time_s


def test_importing_the_cost_model_reads_no_file():
    """The measurements are read, and the GEMM curve fitted, when first asked for."""
    code = ("import sys\nopened = []\n"
            "sys.addaudithook(lambda e, a: opened.append(a[0]) if e == 'open' and 'costmodel/data' in str(a[0]) else None)\n"
            "import minipar.plan.costmodel, minipar.plan.replay\nprint(len(opened))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_a_scenario_is_the_step_estimate_predicts():
    """`estimate` is `step_estimate` of the checked `Scenario`; the replay's target is one."""
    s = cm.scenario(L405, cm.TABLE4[0].parallel(), seq_len=8192)
    assert s.parallel.microbatches == s.microbatches == 32
    assert cm.step_estimate(s) == cm.estimate(L405, cm.TABLE4[0].parallel(), seq_len=8192)
    with pytest.raises(ConfigError, match="--tp 3"):
        cm.scenario(L405, ParallelConfig(tp=3, pp=16, dp=64))


def test_gemms_are_measured_or_follow_the_measured_curve():
    from minipar.plan.costmodel.constants import MEASURED_PEAK_TFLOPS, attention_tflops, gemm_table, measurements
    c = cm.gpu_cluster("h100")

    def efficiency(m, n, k):
        return 2 * m * n * k / (cm.matmul_seconds(m, n, k, c) * c.peak_flops)
    g = measurements()["gemms"][0]
    assert cm.matmul_seconds(g["m"], g["n"], g["k"], c) == pytest.approx(g["s"], rel=1e-3)   # measured
    assert (256, 8192, 8192) not in gemm_table()                                      # the curve
    wide, thin = efficiency(8192, 8192, 8192), efficiency(256, 8192, 8192)
    assert 0.6 < wide < 0.85 and thin < wide
    # an A100 runs the same GEMM slower by its peak
    assert cm.matmul_seconds(g["m"], g["n"], g["k"], cm.gpu_cluster("a100")) > g["s"]
    # attention: faster on longer blocks, cuDNN's faster than FlashAttention-2's on Hopper
    assert attention_tflops("flash", 512) < attention_tflops("flash", 8192) < 989.4
    assert attention_tflops("flash", 4096) < attention_tflops("cudnn", 4096)


def test_collectives_pay_nccls_latency_model():
    from minipar.plan.costmodel.constants import NCCL_LATENCY_US as lat
    from minipar.plan.costmodel.hardware import axis_seconds, collective_latency_s
    c = cm.LLAMA3_CLUSTER
    # inside a server: base + 2(n-1) NVLink steps
    assert collective_latency_s("all_reduce", 8, 1, c) == pytest.approx(1e-6 * (lat["base"] + 14 * 3.4))
    # a ring over 64 servers: only the nodes - 1 crossings pay the network's step
    assert collective_latency_s("all_gather", 64, 64, c) == pytest.approx(1e-6 * (lat["base"] + 63 * 14.0))
    assert collective_latency_s("all_gather", 16, 2, c) == pytest.approx(1e-6 * (lat["base"] + 14 * 3.4 + 14.0))
    # an all-reduce across many servers is a tree: 2 log2(nodes) network steps
    assert collective_latency_s("all_reduce", 128, 128, c) == pytest.approx(1e-6 * (lat["base"] + 2 * 7 * 14.0))
    # ... where a ring would cross servers 2 x 128 times (NCCL counts 2 nodes network steps
    # and the rest, here -2, at NVLink's); all-gather has no tree in NCCL
    ring = lat["base"] + (254 - 256) * 3.4 + 256 * 14.0
    assert collective_latency_s("all_reduce", 128, 128, c, "ring") == pytest.approx(1e-6 * ring)
    assert collective_latency_s("all_gather", 128, 128, c) == pytest.approx(1e-6 * (lat["base"] + 127 * 14.0))
    pc = ParallelConfig(tp=8, pp=16, dp=64)
    one = axis_seconds(1e6, "tp", pc, c, 1.0, "all_reduce", 1)
    assert one == pytest.approx(1e6 / 450e9 + collective_latency_s("all_reduce", 8, 1, c))


def test_tp_overlap_hides_tp_time_and_never_costs():
    pc = cm.TABLE4[0].parallel()
    plain = cm.estimate(L405, pc, seq_len=8192)
    over = cm.estimate(L405, pc.replace(tp_overlap=True), seq_len=8192)
    assert over.time_breakdown_s["tp"] < plain.time_breakdown_s["tp"]
    assert over.mfu > plain.mfu
    assert over.comm_bytes_per_gpu == plain.comm_bytes_per_gpu      # same bytes, hidden


# Rows the physics misses by more than 5 points, each bound a little above today's error:
# the residuals are findings (the note of issue 26 says what each would take), and a change
# that moves a row further out, or any other row past 5, fails here.
UNEXPLAINED = {
    "llama3-405b 8192 GPUs TP8 CP1 PP16 DP64 seq 8192": 6.5,
    "llama3-405b 16384 GPUs TP8 CP16 PP16 DP8 seq 131072": 7.0,    # attention at 131K over CP16
    "80B 32 GPUs TP8 CP1 PP4 DP1 seq 4096": 27.0,       # 2.4x slower: "near the memory limits"
    "80B 64 GPUs TP4 CP1 PP16 DP1 seq 4096": 10.0,
    "nemotron4-15b 16 GPUs TP4 CP1 PP1 DP4 seq 4096": 8.0,     # compute-bound: 98% kernels
    "llama3.1-70b 64 GPUs TP4 CP2 PP4 DP2 seq 8192": 6.0,
}


def test_evaluation_reports_every_row_and_its_targets():
    """Both evaluation sets, every row predicted and none refused; the summary per source and
    over all: mean |error|, mean signed error, worst, without the memory-bound row."""
    from minipar.plan.costmodel.evaluate import evaluated_runs, evaluation, memory_bound, residuals
    runs = evaluated_runs()
    res = residuals(runs)
    assert len(runs) == 27 and [r.framework for r in runs] == ["llama3"] * 3 + ["nanotron"] * 12 + ["nemo"] * 12
    assert [r.label for r in runs if memory_bound(r)] == ["80B 32 GPUs TP8 CP1 PP4 DP1 seq 4096"]
    for run, r in zip(runs, res):
        assert not cm.layout_problems(run.model, run.parallel, run.work), run.label   # no refusal
        assert abs(r) <= UNEXPLAINED.get(run.label, 5.0), (run.label, r)
    ev = evaluation()
    s, kept = ev["summary"], [r for run, r in zip(runs, res) if not memory_bound(run)]
    assert s["mean_abs_error"] == pytest.approx(sum(map(abs, kept)) / 26)
    assert s["mean_signed_error"] == pytest.approx(sum(kept) / 26)
    assert s["targets_hold"] == (s["mean_abs_error"] <= 4 and abs(s["mean_signed_error"]) <= 2
                                 and s["worst_abs_error_not_memory_bound"] <= 8)
    assert [row["error_points"] for row in ev["rows"]] == res
    assert list(ev["sources"]) == ["llama3-paper-table4", "ultrascale-playbook-heatmap",
                                   "nvidia-dgxc-benchmarking"]
    nemo = ev["sources"]["nvidia-dgxc-benchmarking"]
    assert nemo["rows"] == 12 and nemo["mean_signed_error"] == pytest.approx(sum(res[15:]) / 12)


def test_nemo_recipes_are_read_as_they_ran():
    """NVIDIA's recipes: shapes from the CSV (two-matrix MLPs for GPT-3 and Nemotron-4, GPT-3's
    tied head), each recipe's own knobs from its yaml, the MFU recounted in minipar's FLOPs
    from the measured tokens/s (Llama 3.1's as printed, to the rounding; Nemotron-4's lower:
    its README counts more FLOPs per token)."""
    from minipar.plan.flops import param_count
    runs = {r.label: r for r in cm.nemo_runs()}
    gpt3 = runs["gpt3-175b 128 GPUs TP4 CP1 PP8 DP4 seq 2048"]
    assert gpt3.model.mlp == "gelu" and gpt3.model.tie_embeddings and gpt3.parallel.virtual_stages == 12
    assert round(param_count(gpt3.model) / 1e9) == 175      # no biases, no position table
    n340 = runs["nemotron4-340b 128 GPUs TP8 CP1 PP8 DP2 seq 4096"]
    assert n340.model.mlp == "relu2" and not n340.parallel.tp_overlap and not n340.efficiency.p2p_overlap
    assert n340.work.recompute == "selective" and n340.precision.reduce_bytes == 2
    assert round(param_count(n340.model) / 1e9) == 341
    l8 = runs["llama3.1-8b 8 GPUs TP1 CP2 PP1 DP4 seq 8192"]
    assert abs(l8.mfu - l8.printed_mfu) < 0.002 and l8.parallel.cp_impl == "ring"
    n15 = runs["nemotron4-15b 16 GPUs TP4 CP1 PP1 DP4 seq 4096"]
    assert n15.mfu < n15.printed_mfu - 0.05 and n15.work.microbatch_size == 4


def test_ring_attention_runs_blocks_of_a_cp_th_of_the_sequence():
    """Ring CP's kernels work on s/cp-token blocks (timed like a sequence that long); the
    all-gather's one lower-right-masked kernel is its own measurement; Ulysses runs whole
    sequences."""
    from minipar.plan.costmodel.constants import MEASURED_PEAK_TFLOPS, attention_tflops
    from minipar.plan.costmodel.kernels import attention_flops_per_s
    c = cm.gpu_cluster("h100")
    scale = c.peak_tflops / MEASURED_PEAK_TFLOPS * 1e12
    assert attention_flops_per_s("cudnn", 8192, 2, c, "ring") == pytest.approx(attention_tflops("cudnn", 4096) * scale)
    assert attention_flops_per_s("cudnn", 8192, 2, c, "ulysses") == pytest.approx(attention_tflops("cudnn", 8192) * scale)
    assert attention_flops_per_s("cudnn", 8192, 2, c, "allgather") != attention_flops_per_s("cudnn", 8192, 2, c, "ring")


def test_every_answer_carries_its_band():
    """`mfu_band`: the prediction less the stack's largest over-prediction, plus its largest
    under-prediction, over the evaluation's rows of that stack (all rows for a stack with
    fewer than three); --json has it, the human output prints it."""
    import json
    from minipar.plan.costmodel.band import band_errors, mfu_band
    from minipar.plan.costmodel.cli import main
    from minipar.plan.costmodel.evaluate import evaluated_runs, memory_bound, residuals
    runs = evaluated_runs()
    nemo = [r for run, r in zip(runs, residuals(runs)) if run.framework == "nemo"]
    low, high = mfu_band(0.5, "megatron")
    assert (low, high) == pytest.approx((0.5 - max(nemo) / 100, 0.5 - min(nemo) / 100))
    assert band_errors("deepspeed")[0] == "all" and len(band_errors("deepspeed")[1]) == 26
    assert band_errors("llama3")[0] == "llama3" and low < 0.5 < high


def test_the_cli_prints_the_band(capsys):
    import json
    from minipar.plan.costmodel.cli import main
    assert main(["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    low, high = d["mfu_band"]
    assert low < d["mfu"] < high
    assert main([]) == 0
    assert "MFU band" in capsys.readouterr().out


def test_nothing_is_fitted_to_an_mfu():
    """No module of the cost model reads the published runs but the ones that evaluate on
    them; the constants come from the kernel measurements."""
    import importlib.util
    from pathlib import Path
    assert importlib.util.find_spec("minipar.plan.costmodel.fit") is None
    pkg = Path(cm.__file__).parent
    readers = {p.name for p in pkg.glob("*.py") if "published_runs" in p.read_text()}
    assert readers <= {"calibration.py", "evaluate.py", "__init__.py", "constants.py"}
    assert "published_runs" not in (pkg / "constants.py").read_text().split('"""')[2]


def test_the_playbooks_mfu_counts_the_embedding_lookup_as_a_matmul():
    """Every run of the Playbook's interactive figure printed its MFU and its tokens/s. In
    minipar's count (tokens/s x `flops_per_token` / the 989.5 TFLOP/s bench_cluster uses) the
    printed MFU is `playbook_flops_ratio` times larger: 1 + 6hV/F where the embedding is a
    table of its own (1.17 for the 1.34B on two stages), 1 where it is the head's weight."""
    from minipar.plan.costmodel.calibration import (PLAYBOOK_MODELS, flop_count_agreement,
                                                    playbook_flops_ratio, playbook_mfu_ratios)
    assert len(playbook_mfu_ratios()) > 900
    assert flop_count_agreement(0.02) > 0.97                     # within 2 %: 99 % of them
    assert flop_count_agreement(0.05, corrected=False) < 0.6     # as printed, most are not
    assert playbook_flops_ratio(PLAYBOOK_MODELS["1.34B"], 1, 4096) == 1.0
    assert round(playbook_flops_ratio(PLAYBOOK_MODELS["1.34B"], 2, 4096), 2) == 1.17


def test_held_out_cells_are_not_fitted_on_and_are_predicted():
    """The heatmap's cells that are not calibration rows: the fit reads only the calibration
    file, and the model, never having seen them, lands within 8 points of each (the issue's
    goal for runs held back) but the named ones; the committed file says the same."""
    from minipar.plan.costmodel.calibration import heatmap_cells, held_out_runs
    from minipar.plan.costmodel.evaluate import order_kept, residuals
    cells = heatmap_cells()
    calibration = {r.label for r in cm.published_runs() if r.source.startswith("ultrascale")}
    held = held_out_runs()
    assert len(cells) == 26 and len(held) == 14
    assert calibration < {run.label for run, _ in cells}            # same cells, same MFU
    assert not calibration & {r.label for r in held}
    published = {r.label: r.mfu for r in cm.published_runs()}
    assert all(run.mfu == published[run.label] for run, _ in cells if run.label in published)
    res = residuals(held)
    for run, r in zip(held, res):
        assert abs(r) <= 5.0, (run.label, r)
    assert sum(map(abs, res)) / len(res) <= 2.5
    assert order_kept(held, res) >= 0.75


def test_layouts_of_one_model_on_one_cluster_are_ranked_better_than_chance():
    """The Playbook's figure tried many layouts per model and cluster size; ranking them is
    the planner's job. Better than a coin (half the pairs) by a margin, and the first pick
    is the published best somewhere; how often it is not is the chapter's to say."""
    from minipar.plan.costmodel.calibration import playbook_runs
    from minipar.plan.costmodel.evaluate import layout_order
    runs = playbook_runs()
    assert len(runs) > 900 and all(r.mfu >= 0.05 for r in runs)
    order = layout_order(runs)
    assert order["groups"] >= 20 and order["pairs_in_order"] > 0.65
    assert order["first_pick_best"] >= 1 and order["first_pick_below_half"] < order["groups"] / 4


def test_a_stage_of_the_head_alone_is_priced():
    """nanotron's split of the 3.57B over 16 stages leaves a stage only the head; the
    estimate prices it (it used to divide by its zero layers)."""
    from minipar.plan.costmodel.calibration import playbook_runs
    from minipar.plan.costmodel.evaluate import predict
    from minipar.plan.costmodel.workload import nanotron_split
    assert (0, 1) in nanotron_split(cm.PLAYBOOK_MODELS["3.57B"], 16)
    runs = [r for r in playbook_runs() if r.model.name == "3.57B" and r.parallel.pp == 16]
    assert runs and all(0 < predict(r) < 1 for r in runs)


def test_pairs_in_order():
    from minipar.plan.costmodel.evaluate import pairs_in_order
    assert pairs_in_order([1, 2, 3], [10, 20, 30]) == 1.0
    assert pairs_in_order([1, 2, 3], [30, 20, 10]) == 0.0
    assert pairs_in_order([1, 2, 3], [10, 30, 20]) == 2 / 3


def test_memory_model_is_below_what_nanotron_printed():
    """Each heatmap cell printed the memory it used. The memory model counts weights,
    gradients, optimizer state and activations; nanotron also keeps bf16 gradients beside
    its fp32 accumulator, DDP's bucket copies and the allocator's slack, none of which the
    model counts, so it must come out below every cell, and not by more than half."""
    from minipar.plan.costmodel.calibration import heatmap_cells
    from minipar.plan.memory import BF16_MIXED
    for run, printed in heatmap_cells():
        total = cm.memory_per_gpu(run.model, run.parallel, run.work, BF16_MIXED)["total"] / 1e9
        assert 0.5 * printed < total < printed, (run.label, total, printed)


def test_playbook_shapes_match_their_names():
    for name, model in cm.PLAYBOOK_MODELS.items():
        assert f"{flops.param_count(model) / 1e9:.3g}" == name.rstrip("B")


def test_rails_ring_algorithms_stage_pace_and_drain():
    """The physics added for the calibration rows (issue 13), each by hand."""
    from minipar.plan.costmodel.exposure import pipeline_drain_seconds
    from minipar.plan.costmodel.hardware import rail_members
    from minipar.plan.costmodel.workload import nanotron_split, stage_loads
    c = cm.LLAMA3_CLUSTER
    # rails: a TP16 group fills two servers and crosses on all 8 NICs; Llama 3's DP on one
    assert rail_members(c, 1, 16) == 8 and rail_members(c, 128, 64) == 1
    assert cm.group_bandwidth_GBps(c, 1, 16, 512) == min(c.intra_node_GBps, 8 * c.inter_node_GBps)
    assert cm.group_bandwidth_GBps(c, 128, 64, 8192) == c.inter_node_GBps
    # nanotron's split of 80 layers + head on 16 ranks: every layer once, the head last, max 6
    m80 = cm.PLAYBOOK_MODELS["80B"]
    split = nanotron_split(m80, 16)
    assert sum(n for n, _ in split) == 80 and split[-1][1] == 1 and max(n for n, _ in split) == 6
    assert stage_loads(m80, 16, "even") == [(5.0, 1 / 16)]
    # Llama 3's split (paper 3.3.2): one layer fewer on the first and last of 16 x 8 stages
    llama = stage_loads(L405, 16, "trainer", 8)
    assert [n for n, _ in llama] == [7.0] + [8.0] * 14 + [7.0] and [h for _, h in llama][-1] == 1.0
    from minipar.plan.costmodel.table4 import PAPER_SPLIT
    assert all(e.workload.stage_split == PAPER_SPLIT == "trainer" for _, e in cm.table4())
    # the drain hides DP only for the later chunks of an interleaved rank
    assert pipeline_drain_seconds(16, 1, 1.0) == 0 == pipeline_drain_seconds(1, 8, 1.0)
    assert pipeline_drain_seconds(16, 8, 1.0) == pytest.approx(7 / 8 * 15 / 16)


def test_fit_figure_draws_every_row_and_held_out_cell():
    import matplotlib
    matplotlib.use("Agg")
    from minipar.plan.costmodel.calibration import held_out_runs
    from minipar.teach.figures.accuracy import predicted_vs_published
    from minipar.teach.numbers.accuracy import evaluation
    held, *sources = predicted_vs_published().axes[0].collections[1:]   # after the band
    assert len(held.get_offsets()) == len(held_out_runs()) > 0
    assert sum(len(s.get_offsets()) for s in sources) == len(evaluation()[0])


# ------------------------------------------------------------------ issue 26: physics, frameworks
def test_table4_fits_in_80_gib_with_the_papers_fsdp():
    """Llama 3's FSDP shards the fp32 gradients (frameworks.LLAMA3: ZeRO-2); that, not
    recomputation, is what makes every row of Table 4 fit in an H100's 80 GiB."""
    for row, e in cm.table4():
        assert e.parallel.zero == 2 and e.workload.recompute == "none"
        assert e.memory_gb_per_gpu <= 80 * 2**30 / 1e9, (row, e.memory_gb_per_gpu)
        whole = cm.estimate(L405, e.parallel.replace(zero=1), seq_len=row.seq_len,
                            global_batch_tokens=cm.TABLE4_BATCH_TOKENS)
        assert whole.memory_gb_per_gpu > e.memory_gb_per_gpu + 10      # the fp32 buffer


def test_zero2_reduce_scatters_hide_behind_the_rest_of_the_step():
    from minipar.plan.costmodel.exposure import dp_exposed_seconds
    # 4 micro-batches of 1 s, each reduce-scatter 0.9 s: 3.6 s of traffic behind 3 + 2/3 s
    assert dp_exposed_seconds(2, False, 4, 0.9, 0.0, 1.0) == 0.0
    # 1.5 s each: 6 s of traffic, 3 + 2/3 s to hide in
    assert dp_exposed_seconds(2, False, 4, 1.5, 0.0, 1.0) == pytest.approx(6 - 3 - 2 / 3)


def test_zero2_reductions_wait_for_the_first_backward_and_share_the_nic():
    """In a pipeline a rank's first gradient exists only after micro-batch 0 has gone forward
    through every chunk and back to it; the idle bubble is window again. The pipeline's sends
    use the same NIC."""
    from minipar.plan.costmodel.exposure import dp_exposed_seconds, first_backward_delay
    assert first_backward_delay(1, 1, 1.0) == 0.0
    assert first_backward_delay(16, 1, 1.0) == 0.0              # 1F1B: warm-up = bubble
    # p=16, v=8: 15/3 + 15 * 2/24 of forward and backward before, 15/8 of bubble after
    assert first_backward_delay(16, 8, 1.0) == pytest.approx(15 / 3 + 30 / 24 - 15 / 8)
    base = dp_exposed_seconds(2, False, 4, 1.5, 0.0, 1.0)
    assert dp_exposed_seconds(2, False, 4, 1.5, 0.0, 1.0, late=0.5) == pytest.approx(base + 0.5)
    assert dp_exposed_seconds(2, False, 4, 1.5, 0.0, 1.0, shared=0.25) == pytest.approx(base + 0.25)
    # ZeRO-1 reduces once, at the end: neither changes it
    assert (dp_exposed_seconds(1, False, 4, 1.5, 0.0, 1.0, late=0.5, shared=0.25)
            == dp_exposed_seconds(1, False, 4, 1.5, 0.0, 1.0))
    # Table 4 row 1 (TP8: every pipeline neighbour in another server) pays for both
    row = cm.table4()[0][1]
    assert row.time_breakdown_s["dp"] > 0.5


def test_efa_collectives_are_read_off_nccl_tests():
    """The Playbook's cluster (AWS p5) times collectives across servers by nccl-tests on
    EFA: at a measured point exactly, between points in log size, for fewer members per
    server as the same bytes through each NIC, and below the smallest size from NCCL's
    latency up."""
    from minipar.plan.costmodel.constants import fabric_busbw_GBps, fabric_curves
    from minipar.plan.costmodel.hardware import collective_latency_s, measured_collective_seconds
    curves = fabric_curves("efa")
    size, busbw = curves["all_reduce"][16][3]                    # 256 MiB over 16 servers
    assert fabric_busbw_GBps("efa", "all_reduce", 16, size) == busbw
    assert fabric_busbw_GBps("efa", "all_reduce", 64, size) == fabric_busbw_GBps("efa", "all_reduce", 32, size)
    assert fabric_busbw_GBps("efa", "reduce_scatter", 8, size) == fabric_busbw_GBps("efa", "all_gather", 8, size)
    lo, hi = curves["all_gather"][8][2:4]
    mid = fabric_busbw_GBps("efa", "all_gather", 8, (lo[0] * hi[0]) ** 0.5)
    assert mid == pytest.approx((lo[1] + hi[1]) / 2)
    c = cm.PLAYBOOK_CLUSTER
    assert c.fabric == "efa" and cm.LLAMA3_CLUSTER.fabric == "infiniband"
    n = 16 * 8
    wire = 2 * (n - 1) / n * size
    assert measured_collective_seconds(wire, "all_reduce", n, 16, 8, c) == pytest.approx(wire / busbw / 1e9)
    # two members per server: the point of a 4x larger message, at a quarter of its bus rate
    n2 = 16 * 2
    wire2 = 2 * (n2 - 1) / n2 * size / 4
    assert measured_collective_seconds(wire2, "all_reduce", n2, 16, 2, c) == pytest.approx(wire2 / (busbw / 4) / 1e9)
    # small messages: never below NCCL's latency model, growing with size
    small = [measured_collective_seconds(b, "all_gather", 256, 32, 8, c) for b in (1e3, 1e6, 16e6, 33e6)]
    assert small == sorted(small) and small[0] >= 0.99 * collective_latency_s("all_gather", 256, 32, c)
    # a DDP bucket of 25 MB over 32 servers is slower on EFA than alpha-beta says
    pc = ParallelConfig(tp=1, dp=256)
    ib = cm.axis_seconds(25e6, "dp", pc, cm.gpu_cluster("h100"), (0.822, 0.92), "all_gather", 1)
    assert cm.axis_seconds(25e6, "dp", pc, c, (0.822, 0.92), "all_gather", 1) > 1.5 * ib


def test_frameworks_change_what_the_stack_does():
    from minipar.plan.costmodel.frameworks import apply
    pc = cm.TABLE4[0].parallel()
    for name, fw in cm.FRAMEWORKS.items():
        out, precision, eff = apply(fw, L405, pc)
        assert precision.reduce_bytes == fw.reduce_bytes and eff == fw.kernels
        own = fw.zero_with_pp if pc.pp > 1 and fw.zero_with_pp is not None else fw.zero
        assert out.zero == (own if own is not None else pc.zero)
        assert set(fw.sources) >= {"reduce_bytes", "bucket", "zero", "tp_overlap", "kernels"}
    # the same row is slower with nanotron's eager kernels than with the paper's stack
    rows = {name: cm.table4(name)[0][1].mfu for name in cm.FRAMEWORKS}
    assert rows["nanotron"] < rows["llama3"]
    with pytest.raises(ConfigError, match="--framework"):
        cm.framework("jax")


def test_cp_attention_uses_the_chunked_kernel_measurement():
    from minipar.plan.costmodel.constants import MEASURED_PEAK_TFLOPS, attention_tflops, cp_attention_tflops
    c = cm.LLAMA3_CLUSTER
    t1 = cm.attention_seconds(L405, 8192, 131072, 16, 8, c, "cudnn")
    flops = 0.5 * 12 * L405.n_heads * L405.head_dim * 131072 * 8192 / 8
    assert t1 == pytest.approx(flops / (cp_attention_tflops("cudnn") * 1e12 * c.peak_tflops / 989.4))
    assert cp_attention_tflops("cudnn") < attention_tflops("cudnn", 8192)     # its mask is slow


def test_each_rule_plot_places_the_three_worked_pairs_where_the_planner_put_them():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from minipar.teach.figures import fourd as figs
    from minipar.teach.numbers.fourd import WORKED, worked_plan
    for rule, axis, n in ((figs.tp_rule, 0, 3), (figs.bubble_rule, 0, 3), (figs.cp_rule, 0, 3),
                          (figs.cp_rule, 1, 1), (figs.dp_rule, 0, 3)):
        fig = rule()
        labels = [t.get_text() for t in fig.axes[axis].texts if not t.get_text().startswith("budget")]
        assert len(labels) == n, (rule.__name__, labels)
        plt.close(fig)
    tps = {k: worked_plan(k).parallel.tp for k in WORKED}
    labels = [t.get_text() for t in figs.tp_rule().axes[0].texts]
    assert all(f"{k} TP{t}" in labels for k, t in tps.items())
    plt.close("all")


def test_cli_says_where_the_rest_of_the_step_goes(capsys):
    import re
    code, out, _ = run_cli(capsys)
    mfu = float(re.search(r"^MFU\s+([\d.]+) %", out, re.M).group(1))
    line = next(x for x in out.splitlines() if x.startswith("the other"))
    points = [float(v) for v in re.findall(r" ([\d.]+)(?:,|   \()", line)]
    assert code == 0 and "(fits)" in out                    # the paper's FSDP: Table 4 fits
    assert mfu + sum(points) == pytest.approx(100, abs=0.5)


@pytest.mark.parametrize("argv", [["--zero", "1"], ["--zero=1"]])
def test_an_explicit_zero_wins_over_the_framework_in_either_spelling(capsys, argv):
    code, out, _ = run_cli(capsys, "--json", *argv)
    assert code == 0 and json.loads(out)["parallel"]["zero"] == 1        # llama3's profile says 2


# ------------------------------------------------------------------ ZeRO-3, unit by unit
def test_zero3_exposure_unit_by_unit():
    """`zero3_exposed_seconds`: prefetched one unit ahead, a unit's gather hides behind the
    previous unit's compute; only the first gather of each pass and the last reduce-scatter
    stick out, until the comm outlasts the compute: then the link's whole traffic is paid,
    plus one unit's compute. One unit hides nothing."""
    from minipar.plan.costmodel.exposure import zero3_exposed_seconds
    # 10 units, forward 1 s and backward 2 s of compute per micro-batch: f = 0.1, b = 0.2
    assert zero3_exposed_seconds(10, 3, 0.5, 0.5, 1.0, 2.0) == pytest.approx(3 * (0.05 + 0.1))
    # gathers of 0.15 s a unit outlast the forward's 0.1 s, gather + reduce-scatter the backward's
    ag = rs = 1.5
    expected = (0.15 + 9 * 0.05) + (0.3 + 9 * 0.1)
    assert zero3_exposed_seconds(10, 1, ag, rs, 1.0, 2.0) == pytest.approx(expected)
    # link-bound: the micro-batch takes one unit's compute plus all of the traffic
    assert 3.0 + expected == pytest.approx(0.1 + 0.2 + 2 * ag + rs)
    assert zero3_exposed_seconds(1, 2, 0.5, 0.25, 1.0, 2.0) == pytest.approx(2 * 1.25)


def test_zero3_175b_throughput_falls_once_the_gathers_outlast_the_compute():
    """GPT-3 175B under DeepSpeed ZeRO-3 (bf16 gathers and reduce, 5e8-element buckets) on
    A100s with a 200 Gb/s NIC each, 8 per server, at a fixed global batch of 1,536 sequences
    of 2,048 tokens (issue 39, item 3). ZeRO-3 moves the same bytes per GPU per micro-batch
    whatever the DP size; the compute they hide behind shrinks as DP grows, so tokens/s per
    GPU falls once the gathers outlast it. By hand, from the data sheets:

    P = 96 (4 h^2 + 2 h ffn) + V h (tied) = 174.6e9 parameters, 2P = 349 GB in bf16.
    Each micro-batch: an all-gather for the forward, one for the backward, a reduce-scatter
    of the bf16 gradients: 3 collectives, each (n-1)/n of 2P bytes per GPU. The DP group
    holds all 8 GPUs of each server, and NCCL runs one ring per NIC, so a GPU's ring share
    crosses servers on 8 NICs: 8 x 25 GB/s x 0.92 (nccl-tests' bus bandwidth) = 184 GB/s
    (`hardware.rail_members`); each GPU's own NIC carries 1/8 of its 1 TB a step. Each
    1 GB bucket is one ring of n-1 steps: 8.4 us + (servers-1) x 14 us + the rest x 3.4 us
    (NCCL's tuning model). Exposed: per unit (a layer) what the comm exceeds the compute,
    plus each pass's first gather and the last reduce-scatter."""
    from minipar.plan.costmodel.time import dp_terms, microbatch_seconds
    from minipar.plan.costmodel.scenario import scenario
    h, ffn, vocab, layers = 12288, 49152, 51200, 96
    gpt3 = ModelConfig(n_layers=layers, dim=h, n_heads=96, n_kv_heads=96, ffn_dim=ffn,
                       vocab_size=vocab, max_seq_len=2048, mlp="gelu", tie_embeddings=True)
    a100 = cm.gpu_cluster("a100", inter_node_Gbps=200)
    assert a100.gpus_per_node == 8
    batch = dict(seq_len=2048, global_batch=1536, framework="deepspeed")
    est = {n: cm.estimate(gpt3, ParallelConfig(dp=n, zero=3), cluster=a100, **batch)
           for n in (384, 768, 1536)}
    per_gpu = {n: e.tokens_per_s / n for n, e in est.items()}

    params = layers * (4 * h * h + 2 * h * ffn) + vocab * h
    nbytes = 2 * params                              # bf16 weights, bf16 gradients
    bandwidth = 8 * 25e9 * 0.92

    def collective(n):                               # one all-gather or reduce-scatter
        servers = n // 8
        ring = 1e-6 * (8.4 + (servers - 1) * 14.0 + (n - 1 - (servers - 1)) * 3.4)
        return nbytes * (n - 1) / n / bandwidth + nbytes / 1e9 * ring

    # 1,536 GPUs: one sequence each, one micro-batch. A layer's gather (4.43 s / 96 = 46 ms)
    # outlasts its forward (~38 ms), gather + reduce-scatter its backward (~76 ms): the
    # step is the link's traffic, 3 collectives (13.3 s), plus one layer's compute.
    e = est[1536]
    assert e.microbatches == 1
    comm = 3 * collective(1536)
    assert comm == pytest.approx(13.3, rel=0.01)
    by_hand = comm + e.time_breakdown_s["compute"] / layers + e.time_breakdown_s["optimizer"]
    assert e.step_time_s == pytest.approx(by_hand, rel=0.05)

    # 384 GPUs: 4 micro-batches; a layer's gather (26 ms) hides behind its compute, so only
    # each micro-batch's two first gathers and its last reduce-scatter stick out
    s = scenario(gpt3, ParallelConfig(dp=384, zero=3), a100, **batch)
    t_mb = microbatch_seconds(s).critical
    assert collective(384) / layers < t_mb / 3 / layers
    assert dp_terms(s, t_mb).units == layers
    assert est[384].time_breakdown_s["dp"] == pytest.approx(4 * 3 * collective(384) / layers, rel=0.05)

    # throughput per GPU: flat while compute-bound, falling once the network binds
    assert per_gpu[384] >= per_gpu[768] > 1.05 * per_gpu[1536]


def test_every_published_run_fits_where_it_ran_and_plan_lists_the_recipes():
    """Each run of both evaluation sets fits in its GPUs' HBM by the model's count; `plan`,
    with its stated headroom, lists the layout of each of NVIDIA's recipes under the recipe's
    own stack (NeMo's bf16 gradient buffers, the logits and the loss's fp32 softmax on the
    last stage counted)."""
    from minipar.plan.costmodel.calibration import NEMO_FILE, _rows, nemo_framework
    from minipar.plan.costmodel.evaluate import estimate_run, evaluated_runs
    for run in evaluated_runs():
        assert estimate_run(run).memory_gb_per_gpu <= run.cluster.hbm_gb, run.label
    for row, run in zip(_rows(NEMO_FILE), cm.nemo_runs()):
        pc, w = run.parallel, run.work
        p = cm.plan(run.model, run.cluster, pc.world_size, w.seq_len, w.tokens, top=None,
                    tp_overlap=None, framework=nemo_framework(row["file"]))
        layouts = {(e.parallel.tp, e.parallel.cp, e.parallel.pp, e.parallel.dp,
                    e.parallel.virtual_stages, e.workload.microbatch_size) for e in p.ranked}
        assert (pc.tp, pc.cp, pc.pp, pc.dp, pc.virtual_stages, w.microbatch_size) in layouts, run.label


def test_the_last_stage_keeps_the_logits_and_the_softmax():
    """Fused kernels: the last pipeline rank holds, per micro-batch in flight, the logits in
    bf16 and their fp32 softmax (6 bytes per logit of its vocabulary shard)."""
    from minipar.plan.formulas.memory import logits_saved_bytes
    from minipar.plan.memory import activation_bytes
    from minipar.plan.config import ModelConfig
    m = ModelConfig.preset("llama3-8b")
    assert logits_saved_bytes(m, 8192, 8) == 8192 * 128256 / 8 * 6
    pc = ParallelConfig(tp=8, pp=2, sp=True, microbatches=4)
    last = activation_bytes(m, pc, cm.BF16_MIXED, 8192, 1, 1)
    first = activation_bytes(m, pc, cm.BF16_MIXED, 8192, 1, 0)
    # stage 0 holds 2 micro-batches of its 16 layers, stage 1 one of its 16 and the logits
    assert first - 2 * (last - logits_saved_bytes(m, 8192, 8)) == pytest.approx(0, abs=1)


def test_two_matrix_mlps_keep_two_ffn_activations():
    from dataclasses import replace
    from minipar.plan.formulas.memory import activation_elements
    from minipar.plan.config import ModelConfig
    m = ModelConfig.preset("llama3-8b")
    g = replace(m, mlp="gelu")
    assert activation_elements(m, 1, False, "none") - activation_elements(g, 1, False, "none") == m.ffn_dim
    assert activation_elements(m, 1, False, "selective") - activation_elements(g, 1, False, "selective") == m.ffn_dim


def test_overlapped_reduce_scatters_hold_sms_their_gemms_lose():
    """NeMo's recipes pipeline the attention projection's and the down projection's
    reduce-scatter with their forward GEMMs, holding num_sm SMs (set_sm_margin): those
    GEMMs run on the other SMs, 132 - 24 of an H100's for the 70B's projection."""
    from minipar.plan.costmodel.calibration import nemo_runs
    from minipar.plan.costmodel.kernels import layer_matmul_seconds
    from minipar.plan.config import ModelConfig
    m, c = ModelConfig.preset("llama3-70b"), cm.gpu_cluster("h100")
    plain = layer_matmul_seconds(m, 8192, 4, c)
    held = layer_matmul_seconds(m, 8192, 4, c, (("o", 24), ("down", 16)))
    assert held["o"][0] == pytest.approx(plain["o"][0] * 132 / 108)
    assert held["down"][0] == pytest.approx(plain["down"][0] * 132 / 116)
    assert held["o"][1] == plain["o"][1] and held["qkv"] == plain["qkv"]
    run = next(r for r in nemo_runs() if r.label.startswith("llama3.1-70b 64"))
    assert run.efficiency.tp_comm_sms == (("o", 24), ("down", 16)) and run.parallel.tp_overlap
